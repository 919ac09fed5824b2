"""Memorization, after MAD (Poli et al., 2024; athms/mad-lab, ``generate_memorization_instance``):
a fixed key-value map, the same for every example, learned into the weights.

Tokens: keys ``[0, K)``, values ``[K, V - 1)`` and the insert token ``V - 1``, with
``V = vocab_size`` and ``K = (V - 1) // 2``. The map sends each key to a distinct value (the
first ``K`` of a permutation of the values), drawn with numpy from ``seed``, so the config fixes
it. Int inputs ``[B, T]`` (``T = seq_len``): ``T / 2`` pairs ``k insert``, keys uniform; the
target at each insert position is its key's value (the ``loss_mask`` positions). Values never
appear in the inputs, so nothing can be recalled from context. Not next-token prediction.
Classes: ``V``.

Chance: ``1 / K`` (uniform keys, distinct values).
``spec.baselines["bag_of_tokens_accuracy"]`` (exact; :mod:`attnjax.tasks.bag`): the accuracy of
a predictor that knows the map but sees only the multiset of the inputs so far, so it cannot
tell which key is the current one; it measures how much this task needs order (a one-token look
back), not memorization. At the insert of pair ``i`` the multiset holds keys ``k_0 … k_i``, i.i.d.
uniform, so the current key is each key present with probability ``count / (i + 1)``; the map
being one to one, the best guess is the value of the most frequent key, right with probability
``E[max count] / (i + 1)`` for counts ``Multinomial(i + 1, uniform over K)``. The baseline averages
this over the ``T / 2`` scored positions.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more pairs; each is as hard).

Where attnjax differs: MAD trains on a fixed set of 256 sequences for many epochs; here each
step draws fresh sequences from the same map (the map is the thing to memorize). MAD's optional
noise pairs are left out (its benchmark does not use them).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Int, PRNGKeyArray

from attnjax.tasks import bag, base


@dataclasses.dataclass(frozen=True)
class MemorizationConfig:
    vocab_size: int = 256
    seq_len: int = 32
    seed: int = 12345

    def __post_init__(self):
        base.check_int(self, "vocab_size", 5)
        base.check_int(self, "seq_len", 2)
        base.check_that(self, "seq_len", self.seq_len % 2 == 0, "even")
        base.check_int(self, "seed", 0)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=1 / ((self.vocab_size - 1) // 2),
            vocab_size=self.vocab_size,
            baselines={"bag_of_tokens_accuracy": self._bag_of_tokens()},
        )

    def _bag_of_tokens(self) -> float:
        """The mean over pairs ``i`` of ``E[max count] / (i + 1)`` (module docstring)."""
        pairs = self.seq_len // 2
        keys = np.arange(1, pairs + 1)
        return float(np.mean(bag.mean_max_counts(pairs, (self.vocab_size - 1) // 2)[keys] / keys))


@functools.cache
def value_map(config: MemorizationConfig) -> Int[np.ndarray, " K"]:
    """The value of each key (cached per config)."""
    num_keys = (config.vocab_size - 1) // 2
    rng = np.random.default_rng(config.seed)
    return rng.permutation(np.arange(num_keys, config.vocab_size - 1))[:num_keys]


def generate(key: PRNGKeyArray, batch_size: int, config: MemorizationConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, pairs = config.vocab_size, config.seq_len // 2
    keys = jax.random.randint(key, (batch_size, pairs), 0, (vocab - 1) // 2)
    values = jnp.asarray(value_map(config), jnp.int32)[keys]
    insert = jnp.full((batch_size, pairs), vocab - 1)
    blank = jnp.zeros((batch_size, pairs), jnp.int32)
    mask = jnp.broadcast_to(jnp.arange(config.seq_len) % 2 == 1, (batch_size, config.seq_len))
    return {
        "inputs": jnp.stack([keys, insert], axis=2).reshape(batch_size, -1).astype(jnp.int32),
        "targets": jnp.stack([blank, values], axis=2).reshape(batch_size, -1),
        "loss_mask": mask,
    }


TASK = base.Task("memorization", MemorizationConfig, generate)
