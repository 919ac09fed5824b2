"""XOR relation: retrieve the value of the one key that matches the query in exactly one bit.

Every token carries two binary features ``(f1, f2)``. A key is *relevant* iff it matches the
query in exactly one of the two positions: ``(k1 == q1) xor (k2 == q2)``, i.e. its feature
parity differs from the query's. Each example has ``num_keys`` keys: exactly one relevant key
(``q`` with one bit flipped, which bit uniform), and ``num_keys - 1`` distractors, each either
equal to ``q`` or its complement, with at least one of each kind; positions are shuffled.
Every key carries a value uniform in ``[0, num_values)``; the query carries none.

Why both distractor kinds: for a fixed query a bilinear score ``qᵀWk`` is affine in the key's
raw bits, ``s = w1·k1 + w2·k2 + c``. For ``q = (0, 0)``, ranking ``(1, 0)`` above ``(0, 0)``
and ``(1, 1)`` needs ``w1 > 0 > w2``, ranking ``(0, 1)`` first needs ``w2 > 0 > w1``: the bits
can favour the relevant key for only one of the two relevant kinds (a value-dependent term of
the key, independent of relevance, comes on top). With one embedding per token, any score can
be learned per key kind, so a dot product can solve the task too.

Sequence ``[key_1, ..., key_n, query]``, ``T = num_keys + 1``; the target, the relevant key's
value, sits at the query (last) position, the only ``loss_mask`` position.

- ``encoding="linear"``: float inputs ``[B, T, 3 + num_values]`` per token
  ``[f1, f2, is_query, one_hot(value)]`` (the query's value part is 0).
- ``encoding="embedding"``: int inputs ``[B, T]``; a key is ``(2·f1 + f2)·num_values + value``,
  the query is ``4·num_values + 2·q1 + q2``; vocabulary ``4·num_values + 4``.

Classes: ``num_values``. Chance: ``1 / num_values``.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class XorRelationConfig:
    num_keys: int = 8
    num_values: int = 8
    encoding: str = "linear"

    def __post_init__(self):
        base.check_int(self, "num_keys", 3)
        base.check_int(self, "num_values", 2)
        base.check_choice(self, "encoding", ("linear", "embedding"))

    @property
    def spec(self) -> base.TaskSpec:
        linear = self.encoding == "linear"
        return base.TaskSpec(
            seq_len=self.num_keys + 1,
            num_classes=self.num_values,
            chance_accuracy=1 / self.num_values,
            vocab_size=None if linear else 4 * self.num_values + 4,
            num_features=3 + self.num_values if linear else None,
        )


def generate(key: PRNGKeyArray, batch_size: int, config: XorRelationConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    n, v = config.num_keys, config.num_values

    def example(key):
        k_query, k_flip, k_kinds, k_perm, k_values = jax.random.split(key, 5)
        query = jax.random.bernoulli(k_query, shape=(2,)).astype(jnp.int32)
        flip = jax.nn.one_hot(jax.random.randint(k_flip, (), 0, 2), 2, dtype=jnp.int32)
        # Distractor kinds: 0 = equal to the query, 1 = its complement; both always present.
        kinds = jnp.concatenate(
            [jnp.array([0, 1]), jax.random.bernoulli(k_kinds, shape=(n - 3,)).astype(jnp.int32)]
        )
        keys = jnp.concatenate([(query ^ flip)[None], query[None] ^ kinds[:, None]])
        perm = jax.random.permutation(k_perm, n)
        values = jax.random.randint(k_values, (n,), 0, v)
        return query, keys[perm], values, values[jnp.argmin(perm)]

    query, keys, values, target = base.split_examples(example, key, batch_size)
    if config.encoding == "linear":
        key_tokens = jnp.concatenate(
            [keys, jnp.zeros((batch_size, n, 1), jnp.int32), jax.nn.one_hot(values, v)], axis=-1
        )
        query_token = jnp.concatenate(
            [query, jnp.ones((batch_size, 1)), jnp.zeros((batch_size, v))], -1
        )
        inputs = jnp.concatenate([key_tokens, query_token[:, None]], axis=1).astype(jnp.float32)
    else:
        key_tokens = (2 * keys[..., 0] + keys[..., 1]) * v + values
        query_token = 4 * v + 2 * query[:, 0] + query[:, 1]
        inputs = jnp.concatenate([key_tokens, query_token[:, None]], axis=1).astype(jnp.int32)
    return base.one_target(inputs, target)


TASK = base.Task("xor_relation", XorRelationConfig, generate)
