"""Compression, after MAD (Poli et al., 2024; athms/mad-lab, ``generate_compression_instance``).

Tokens: content ``[0, C)``, noise ``[C, V - 1)`` and the compression token ``V - 1``, with
``V = vocab_size``, ``C = V - 1 - noise_vocab_size``. MAD's sequence of ``L = seq_len`` tokens
is ``L - 1`` uniform content tokens, each replaced by a uniform noise token with probability
``frac_noise``, then the compression token. Int inputs ``[B, 2L - 2]``: that sequence followed
by ``L - 2`` more compression tokens; the target at position ``L - 1 + i`` is token ``i`` of the
sequence, scored (``loss_mask``) where it is content, not noise. Not next-token prediction.
Classes: ``V``.

Chance: ``1 / C`` per position (``sequence_accuracy``: ``C^-(L - 1)`` without noise).
``spec.baselines["bag_of_tokens_accuracy"]`` (exact; :mod:`attnjax.tasks.bag`): at every scored
position the inputs so far hold the whole sequence, whose multiset says which tokens occur how
often but not in which order, plus compression tokens (their number gives the position). The
``L - 1`` tokens are i.i.d., so given their multiset every ordering is equally likely: token
``i`` is content token ``c`` (and so scored, with target ``c``) with probability
``count(c) / (L - 1)`` whatever ``i``. The best order-blind guess is the most frequent content
token everywhere, right at ``E[max_c count(c)]`` positions per example out of
``(L - 1)(1 - frac_noise)`` scored. The number of content tokens is
``Binomial(L - 1, 1 - frac_noise)`` and, given it, their counts are uniform multinomial over the
``C`` content tokens.
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
import numpy as np
from jaxtyping import PRNGKeyArray
from scipy import stats

from attnjax.tasks import bag, base


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
            baselines={"bag_of_tokens_accuracy": self._bag_of_tokens()},
        )

    def _bag_of_tokens(self) -> float:
        """``E[max content count] / E[content count]`` (module docstring)."""
        n, keep = self.seq_len - 1, 1 - self.frac_noise
        content = stats.binom.pmf(np.arange(n + 1), n, keep)
        best = content @ bag.mean_max_counts(n, self.vocab_size - 1 - self.noise_vocab_size)
        return float(best / (n * keep))


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
