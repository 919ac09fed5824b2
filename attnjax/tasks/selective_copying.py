"""Selective copying, after MAD (Poli et al., 2024; athms/mad-lab,
``generate_selective_copying_instance``; the task of Gu and Dao's Mamba, 2023).

Tokens: content ``[0, V - 2)``, blank ``V - 2`` and copy ``V - 1`` (``V = vocab_size``). Int inputs
``[B, T]`` (``T = seq_len``): ``N = num_tokens`` uniform content tokens at ``N`` distinct
positions, uniform among the first ``T - N - 1``, in order, blanks elsewhere; the copy token at
``T - N - 1``; then ``N`` blanks, whose targets are the content tokens in order (the
``loss_mask`` positions). Not next-token prediction: a target is never the next input.
Requires ``T > 2N + 1``. Classes: ``V``.

Chance: ``1 / (V - 2)`` per position (``sequence_accuracy``: ``(V - 2)^-N``).
``spec.baselines["bag_of_tokens_accuracy"]`` (exact; :mod:`attnjax.tasks.bag`): at every scored
position the inputs so far hold the same ``N`` content tokens, and their multiset says which
tokens occur how often but not in which order. The tokens are i.i.d., so given their multiset
every ordering is equally likely and target ``j`` is token ``c`` with probability
``count(c) / N`` (the positions carry nothing: blanks, the copy token, and where the tokens sat
are independent of the tokens). The best order-blind guess is the most frequent token, right
with probability ``E[max_c count(c)] / N`` at every scored position, for counts
``Multinomial(N, uniform over V - 2)``.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more blanks, the same ``N`` tokens).

Where attnjax differs: MAD inserts its blanks with ``np.insert`` at indices below ``N``, so the
last content token always sits just before the copy token; here the ``N`` positions are a
uniform subset of the first ``T - N - 1``.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import bag, base


@dataclasses.dataclass(frozen=True)
class SelectiveCopyingConfig:
    vocab_size: int = 16
    seq_len: int = 256
    num_tokens: int = 16

    def __post_init__(self):
        base.check_int(self, "vocab_size", 4)
        base.check_int(self, "num_tokens", 1)
        base.check_int(self, "seq_len", 2 * self.num_tokens + 2)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=1 / (self.vocab_size - 2),
            vocab_size=self.vocab_size,
            baselines={"bag_of_tokens_accuracy": self._bag_of_tokens()},
        )

    def _bag_of_tokens(self) -> float:
        """``E[max count] / N`` (module docstring)."""
        n = self.num_tokens
        return float(bag.mean_max_counts(n, self.vocab_size - 2)[n] / n)


def generate(key: PRNGKeyArray, batch_size: int, config: SelectiveCopyingConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, seq_len, n = config.vocab_size, config.seq_len, config.num_tokens
    copy = seq_len - n - 1

    def example(key):
        k_pos, k_tokens = jax.random.split(key)
        positions = jnp.sort(jnp.argsort(jax.random.uniform(k_pos, (copy,)))[:n])
        tokens = jax.random.randint(k_tokens, (n,), 0, vocab - 2)
        inputs = jnp.full(seq_len, vocab - 2).at[positions].set(tokens).at[copy].set(vocab - 1)
        return inputs, jnp.zeros(seq_len, jnp.int32).at[copy + 1 :].set(tokens)

    inputs, targets = base.split_examples(example, key, batch_size)
    mask = jnp.broadcast_to(jnp.arange(seq_len) > copy, (batch_size, seq_len))
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": mask,
    }


TASK = base.Task(
    "selective_copying", SelectiveCopyingConfig, generate, metrics=base.sequence_metrics
)
