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
