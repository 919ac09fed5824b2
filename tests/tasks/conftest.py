import functools

import jax
import numpy as np
import pytest

from attnjax import tasks

# One small config per task, shared by all task tests so each compiles once per process.
SMALL = {
    "xor_relation": dict(num_keys=5, num_values=4),
    "xor_bits": dict(),
    "min_of_keys": dict(num_keys=5, num_values=4),
    "copy": dict(length=3, distance=5, num_symbols=4),
    "impostor": dict(dim=4, num_keys=5, num_values=4),
    "head_ordering": dict(num_items=5, num_orders=3, num_present=3, num_values=3),
    "mqar": dict(vocab_size=16, seq_len=16, num_pairs=3, power_a=0.5),
    "markov": dict(vocab_size=6, order=2, num_successors=3, seq_len=16),
    "in_context_recall": dict(vocab_size=10, seq_len=16),
    "noisy_recall": dict(vocab_size=14, noise_vocab_size=4, frac_noise=0.3, seq_len=16),
    "fuzzy_recall": dict(vocab_size=11, seq_len=24, key_size=2, value_size=2),
    "selective_copying": dict(vocab_size=6, seq_len=16, num_tokens=4),
    "compression": dict(vocab_size=8, seq_len=8),
    "memorization": dict(vocab_size=9, seq_len=8),
    "automaton": dict(
        num_symbols=5, alphabet_size=4, num_states=4, max_degree=2, max_length=5, seq_len=24
    ),
}
BATCH = 256


@functools.cache
def _jitted(name):
    return jax.jit(tasks.get(name).generate, static_argnums=(1, 2))


@pytest.fixture
def small():
    """``small(name, seed=0, **overrides) -> (config, batch)``: a jitted batch of ``BATCH``
    examples of the task's small config, as numpy arrays."""

    def draw(name, seed=0, **overrides):
        config = tasks.get(name).config(**{**SMALL[name], **overrides})
        batch = _jitted(name)(jax.random.key(seed), BATCH, config)
        return config, {k: np.asarray(v) for k, v in batch.items()}

    return draw
