"""Min-of-keys selection: retrieve the value of the key maximizing ``min(k1, k2)``.

Each of ``num_keys`` keys carries a 2-D vector ``(k1, k2)``, i.i.d. uniform in ``[0, 1)²`` (the
maximizer is unique with probability 1), and a value uniform in ``[0, num_values)``; with
``distinct_values`` the keys' values are drawn without replacement (``num_values >= num_keys``),
so no two keys share a value and retrieving the right value is selecting the right key. The
sequence is ``[key_1, ..., key_n, query]``, ``T = num_keys + 1``; the query token is the same in
every example, so one attention head's query vector is fixed. The target, the maximizer's
value, sits at the query (last) position, the only ``loss_mask`` position.

Float inputs ``[B, T, 3 + num_values]``, per token ``[k1, k2, is_query, one_hot(value)]``; the
query is ``[0, 0, 1, 0, ...]``. Classes: ``num_values``. Chance: ``1 / num_values``.

A dot-product head with a fixed query ranks keys by a linear function, so its top key is a
vertex of the keys' convex hull; the maximizer of ``min(k1, k2)`` often is not. The best single
direction, ``k1 + k2``, picks the maximizer in about 79% of examples (measured for
``num_keys`` from 4 to 32); a model well above that uses more than one linear ranking. Two
rankings, each picking its top key, with a perfect choice between them, pick it in about 84%
(``two_direction_accuracy``): the ceiling of two heads that each select one key. Both count
*keys*; the metric scores *values*, and a wrong key carries the right value with probability
``1 / num_values`` unless values are distinct: ``*_value_accuracy`` are the same limits counted
by value (``p + (1 - p) / num_values``, or ``p`` with ``distinct_values``).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class MinOfKeysConfig:
    num_keys: int = 8
    num_values: int = 8
    distinct_values: bool = False

    def __post_init__(self):
        if not isinstance(self.distinct_values, bool):
            raise ValueError(
                f"MinOfKeysConfig.distinct_values must be a bool, got {self.distinct_values!r}"
            )
        base.check_int(self, "num_keys", 2)
        base.check_int(self, "num_values", self.num_keys if self.distinct_values else 2)

    @property
    def spec(self) -> base.TaskSpec:
        one, two = single_direction_accuracy(self.num_keys), two_direction_accuracy(self.num_keys)
        return base.TaskSpec(
            seq_len=self.num_keys + 1,
            num_classes=self.num_values,
            chance_accuracy=1 / self.num_values,
            num_features=3 + self.num_values,
            baselines={
                "single_direction_accuracy": one,
                "two_direction_accuracy": two,
                "single_direction_value_accuracy": self.by_value(one),
                "two_direction_value_accuracy": self.by_value(two),
            },
        )

    def by_value(self, key_accuracy: float) -> float:
        """The value accuracy of a selector that picks the right key with probability
        ``key_accuracy``: a wrong key's value is uniform and independent of the target's unless
        values are distinct."""
        wrong = 0.0 if self.distinct_values else 1 / self.num_values
        return key_accuracy + (1 - key_accuracy) * wrong


@functools.lru_cache(maxsize=16)
def single_direction_accuracy(num_keys: int, samples: int = 200_000) -> float:
    """How often ranking by ``k1 + k2``, the best single linear ranking, picks the maximizer
    of ``min(k1, k2)`` (Monte Carlo with a fixed seed; about 0.79)."""
    keys = np.random.default_rng(0).random((samples, num_keys, 2))
    return float(np.mean(keys.sum(-1).argmax(-1) == keys.min(-1).argmax(-1)))


@functools.lru_cache(maxsize=16)
def two_direction_accuracy(num_keys: int, samples: int = 50_000, angles: int = 180) -> float:
    """How often the better of two linear rankings picks the maximizer, for the best pair of
    ranking directions (a grid of ``angles`` directions in the (k1, k2) plane, Monte Carlo with a
    fixed seed): the ceiling of two heads that each select their top key, followed by a perfect
    selector between the two (about 0.84 for 8 keys)."""
    keys = np.random.default_rng(1).random((samples, num_keys, 2))
    theta = np.linspace(0, 2 * np.pi, angles, endpoint=False)
    directions = np.stack([np.cos(theta), np.sin(theta)])  # [2, D]
    best = keys.min(-1).argmax(-1)
    right = np.stack([(keys @ d).argmax(-1) == best for d in directions.T]).astype(np.float32)
    either = right.mean(1)[:, None] + right.mean(1)[None, :] - right @ right.T / samples
    return float(either.max())


def generate(key: PRNGKeyArray, batch_size: int, config: MinOfKeysConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    n, v = config.num_keys, config.num_values
    k_vectors, k_values = jax.random.split(key)
    vectors = jax.random.uniform(k_vectors, (batch_size, n, 2))
    if config.distinct_values:
        values = jax.vmap(lambda k: jax.random.permutation(k, v)[:n])(
            jax.random.split(k_values, batch_size)
        )
    else:
        values = jax.random.randint(k_values, (batch_size, n), 0, v)
    best = jnp.argmax(jnp.min(vectors, axis=-1), axis=-1)
    keys = jnp.concatenate(
        [vectors, jnp.zeros((batch_size, n, 1)), jax.nn.one_hot(values, v)], axis=-1
    )
    query = jnp.zeros((batch_size, 1, 3 + v)).at[:, :, 2].set(1.0)
    inputs = jnp.concatenate([keys, query], axis=1)
    return base.one_target(inputs, jnp.take_along_axis(values, best[:, None], axis=1)[:, 0])


TASK = base.Task("min_of_keys", MinOfKeysConfig, generate)
