"""Compression, after MAD (Poli et al., 2024; athms/mad-lab, ``generate_compression_instance``).

Tokens: content ``[0, C)``, noise ``[C, V - 1)`` and the compression token ``V - 1``, with
``V = vocab_size``, ``C = V - 1 - noise_vocab_size``. MAD's sequence of ``L = seq_len`` tokens
is ``L - 1`` uniform content tokens, each replaced by a uniform noise token with probability
``frac_noise``, then the compression token. Int inputs ``[B, 2L - 2]``: that sequence followed
by ``L - 2`` more compression tokens; the target at position ``L - 1 + i`` is token ``i`` of the
sequence, scored (``loss_mask``) where it is content, not noise. Not next-token prediction.
Classes: ``V``.

Chance: ``1 / C`` per position (``sequence_accuracy``: ``C^-(L - 1)`` without noise).
Length extrapolation: :func:`attnjax.tasks.base.longer` (a longer sequence to reconstruct).

Where attnjax differs: MAD trains an autoencoder whose decoder sees only the state at the
compression token (plus the position it decodes), so the task measures what that one state can
hold. attnjax's models are sequence-to-sequence maps: a causal model can attend from output
``i`` straight to input ``i``, which makes this a copy at the fixed distance ``L - 1`` unless the
model itself imposes the bottleneck (MAD's ``global_pool="last"`` readout). Read results as such.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    vocab_size: int = 16
    seq_len: int = 32
    noise_vocab_size: int = 0
    frac_noise: float = 0.0

    def __post_init__(self):
        base.check_noise(self)
        base.check_int(self, "vocab_size", self.noise_vocab_size + 3)
        base.check_int(self, "seq_len", 2)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=2 * self.seq_len - 2,
            num_classes=self.vocab_size,
            chance_accuracy=1 / (self.vocab_size - 1 - self.noise_vocab_size),
            vocab_size=self.vocab_size,
        )


def generate(key: PRNGKeyArray, batch_size: int, config: CompressionConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, n = config.vocab_size, config.seq_len - 1
    content = vocab - 1 - config.noise_vocab_size
    k_tokens, k_noisy, k_noise = jax.random.split(key, 3)
    tokens = jax.random.randint(k_tokens, (batch_size, n), 0, content)
    noisy = jax.random.bernoulli(k_noisy, config.frac_noise, (batch_size, n))
    noise = jax.random.randint(k_noise, (batch_size, n), content, vocab - 1)
    tokens = jnp.where(noisy, noise, tokens)
    decode = jnp.full((batch_size, n), vocab - 1)
    blank = jnp.zeros((batch_size, n), jnp.int32)
    return {
        "inputs": jnp.concatenate([tokens, decode], axis=1).astype(jnp.int32),
        "targets": jnp.concatenate([blank, jnp.where(noisy, 0, tokens)], axis=1).astype(jnp.int32),
        "loss_mask": jnp.concatenate([blank.astype(bool), ~noisy], axis=1),
    }


TASK = base.Task("compression", CompressionConfig, generate, metrics=base.sequence_metrics)
