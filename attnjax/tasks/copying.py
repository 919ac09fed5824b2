"""Copy: reproduce ``length`` symbols, each ``distance`` positions after it appeared.

Symbols ``x_0 … x_{L-1}`` are i.i.d. uniform in ``[0, num_symbols)``. Int inputs ``[B, T]`` with
``T = distance + length``: the symbols at positions ``0 … L-1``, then blanks (token
``num_symbols``), a delimiter (token ``num_symbols + 1``) at position ``distance - 1``, then
blanks while the model writes. The target ``x_i`` sits at position ``distance + i`` (the
``loss_mask`` positions), so every input-to-output path spans exactly ``distance`` steps and a
causal model sees each symbol before it must reproduce it. Requires ``distance > length``.

Vocabulary ``num_symbols + 2``; classes ``num_symbols``. Chance: ``1 / num_symbols`` per
position (``sequence_accuracy``: ``num_symbols ** -length``).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class CopyConfig:
    length: int = 8
    distance: int = 16
    num_symbols: int = 8

    def __post_init__(self):
        base.check_int(self, "length", 1)
        base.check_int(self, "num_symbols", 2)
        base.check_int(self, "distance", self.length + 1)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=self.distance + self.length,
            num_classes=self.num_symbols,
            chance_accuracy=1 / self.num_symbols,
            vocab_size=self.num_symbols + 2,
        )


def generate(key: PRNGKeyArray, batch_size: int, config: CopyConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    length, distance, blank = config.length, config.distance, config.num_symbols
    symbols = jax.random.randint(key, (batch_size, length), 0, blank)
    seq_len = distance + length
    inputs = jnp.full((batch_size, seq_len), blank).at[:, :length].set(symbols)
    inputs = inputs.at[:, distance - 1].set(blank + 1)
    targets = jnp.zeros((batch_size, seq_len)).at[:, distance:].set(symbols)
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": jnp.broadcast_to(jnp.arange(seq_len) >= distance, (batch_size, seq_len)),
    }


TASK = base.Task("copy", CopyConfig, generate, metrics=base.sequence_metrics)
