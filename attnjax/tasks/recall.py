"""In-context recall and noisy in-context recall, after MAD (Poli et al., 2024; athms/mad-lab,
``generate_in_context_recall_instance`` with ``multi_query=True``, as its benchmark runs it).

Tokens: keys ``[0, K)``, values ``[K, V - N)`` and noise ``[V - N, V)``, with ``V = vocab_size``,
``N = noise_vocab_size`` and ``K = (V - N) // 2``. Each example draws a key-value map (every key
a uniform value) and fills ``T = seq_len`` positions with ``T / 2`` pairs ``k v``: keys uniform,
each followed by its value; each pair but the last becomes two uniform noise tokens with
probability ``frac_noise``, except one pair drawn among them, kept so the last pair has a key to
repeat. The last pair's key is uniform over the distinct keys of the real pairs before it.
Int inputs ``[B, T]``; the ``loss_mask`` marks each key position whose key appeared in an
earlier real pair, with its value (the next input) as target: next-token prediction, scored
where the answer is in context. Vocabulary and classes: ``V``.

Chance: ``1 / (V - N - K)``, values being uniform and independent of the keys.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more pairs, same vocabulary).

Where attnjax differs: MAD trains on every next token and tests on the recalled values only;
here both train and test score the recalled values (the other targets are uniform draws no
model can predict). MAD's noise pairs are drawn per pair as here; its fixed-size example sets
(12 800 for training) are replaced by fresh draws at every step.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class RecallConfig:
    vocab_size: int = 16
    seq_len: int = 128
    noise_vocab_size: int = 0
    frac_noise: float = 0.0

    def __post_init__(self):
        base.check_noise(self)
        base.check_int(self, "vocab_size", self.noise_vocab_size + 4)
        base.check_int(self, "seq_len", 4)
        base.check_that(self, "seq_len", self.seq_len % 2 == 0, "even")

    @property
    def spec(self) -> base.TaskSpec:
        clean = self.vocab_size - self.noise_vocab_size
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=1 / (clean - clean // 2),
            vocab_size=self.vocab_size,
        )


@dataclasses.dataclass(frozen=True)
class NoisyRecallConfig(RecallConfig):
    """MAD's noisy recall baseline: 16 noise tokens, a fifth of the pairs noise."""

    vocab_size: int = 32
    noise_vocab_size: int = 16
    frac_noise: float = 0.2


def generate(key: PRNGKeyArray, batch_size: int, config: RecallConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, seq_len = config.vocab_size, config.seq_len
    clean = vocab - config.noise_vocab_size
    num_keys, pairs = clean // 2, seq_len // 2

    def example(key):
        k_keys, k_map, k_noisy, k_kept, k_noise, k_last = jax.random.split(key, 6)
        keys = jax.random.randint(k_keys, (pairs,), 0, num_keys)
        values = jax.random.randint(k_map, (num_keys,), num_keys, clean)
        noisy = jax.random.bernoulli(k_noisy, config.frac_noise, (pairs,))
        kept = jax.random.randint(k_kept, (), 0, pairs - 1)
        noisy = noisy.at[kept].set(False).at[-1].set(False)
        real = ~noisy[:-1]
        seen = jnp.zeros(num_keys).at[keys[:-1]].add(real.astype(jnp.float32)) > 0
        keys = keys.at[-1].set(jax.random.categorical(k_last, jnp.where(seen, 0.0, -1e9)))
        noise = jax.random.randint(k_noise, (pairs, 2), clean, vocab)
        tokens = jnp.where(noisy[:, None], noise, jnp.stack([keys, values[keys]], axis=1))
        index = jnp.arange(pairs)
        before = (keys[:, None] == keys[None, :]) & ~noisy[None, :] & (index[None] < index[:, None])
        recalled = ~noisy & jnp.any(before, axis=1)
        mask = jnp.stack([recalled, jnp.zeros_like(recalled)], axis=1).reshape(seq_len)
        tokens = tokens.reshape(seq_len)
        return tokens, jnp.where(mask, jnp.roll(tokens, -1), 0), mask

    inputs, targets, mask = base.split_examples(example, key, batch_size)
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": mask,
    }


TASK = base.Task("in_context_recall", RecallConfig, generate, next_token=True)
NOISY_TASK = base.Task("noisy_recall", NoisyRecallConfig, generate, next_token=True)
