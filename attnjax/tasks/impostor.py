"""Magnitude impostor: find the key pointing exactly along the query, despite a long impostor.

The query carries a direction ``u``, uniform on the unit sphere in ``R^dim``. Among
``num_keys`` keys (positions shuffled): the *match* ``u`` itself (norm 1), one *impostor*
``impostor_norm · (c·u + sqrt(1 - c²)·w)`` with ``c = impostor_cosine`` and ``w`` a uniform unit
vector orthogonal to ``u``, and ``num_keys - 2`` distractors uniform on the unit sphere. The
match is the only key at cosine 1 with the query, so the answer is unique (distractors reach
cosine 1 with probability 0). With identity projections, a dot product prefers the impostor
iff ``impostor_norm · c > 1``; cosine never does. ``offset`` (default 0) is added to every
coordinate of the query and key vectors: the inputs of a score are then no longer centered.

Sequence ``[key_1, ..., key_n, query]``, ``T = num_keys + 1``. Float inputs
``[B, T, dim + 1 + num_values]``, per token ``[vector, is_query, one_hot(value)]`` (the
query's value part is 0); every key carries a value uniform in ``[0, num_values)``. The target,
the match's value, sits at the query (last) position, the only ``loss_mask`` position.
Classes: ``num_values``. Chance: ``1 / num_values``.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class ImpostorConfig:
    dim: int = 8
    num_keys: int = 8
    impostor_norm: float = 10.0
    impostor_cosine: float = 0.5
    num_values: int = 8
    offset: float = 0.0

    def __post_init__(self):
        base.check_int(self, "dim", 2)
        base.check_int(self, "num_keys", 2)
        base.check_float(self, "impostor_norm", 0.0, open_low=True)
        base.check_float(self, "impostor_cosine", -1.0, 1.0, open_low=True)
        base.check_that(self, "impostor_cosine", self.impostor_cosine < 1, "< 1")
        base.check_int(self, "num_values", 2)
        base.check_float(self, "offset", -math.inf)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=self.num_keys + 1,
            num_classes=self.num_values,
            chance_accuracy=1 / self.num_values,
            num_features=self.dim + 1 + self.num_values,
        )


def _unit(x: Float[Array, "... D"]) -> Float[Array, "... D"]:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def generate(key: PRNGKeyArray, batch_size: int, config: ImpostorConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    n, d, v, c = config.num_keys, config.dim, config.num_values, config.impostor_cosine

    def example(key):
        k_dirs, k_perm, k_values = jax.random.split(key, 3)
        dirs = _unit(jax.random.normal(k_dirs, (n, d)))
        u = dirs[0]
        w = _unit(dirs[1] - jnp.dot(dirs[1], u) * u)
        impostor = config.impostor_norm * (c * u + jnp.sqrt(1 - c**2) * w)
        keys = jnp.concatenate([u[None], impostor[None], dirs[2:]])
        perm = jax.random.permutation(k_perm, n)
        values = jax.random.randint(k_values, (n,), 0, v)
        return u, keys[perm], values, values[jnp.argmin(perm)]

    query, keys, values, target = base.split_examples(example, key, batch_size)
    query, keys = query + config.offset, keys + config.offset
    key_tokens = jnp.concatenate(
        [keys, jnp.zeros((batch_size, n, 1)), jax.nn.one_hot(values, v)], axis=-1
    )
    query_token = jnp.concatenate(
        [query, jnp.ones((batch_size, 1)), jnp.zeros((batch_size, v))], -1
    )
    inputs = jnp.concatenate([key_tokens, query_token[:, None]], axis=1)
    return base.one_target(inputs, target)


TASK = base.Task("impostor", ImpostorConfig, generate)
