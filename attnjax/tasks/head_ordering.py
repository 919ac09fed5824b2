"""Head ordering: report, for each of several preference orders, the value of its top item.

There are ``m`` items and ``R = len(orders)`` fixed preference orders over them; ``orders[r]``
lists the items from most to least preferred (the default ``((0, 2, 1), (1, 0, 2))`` is
1≻3≻2 and 2≻1≻3 in 1-based names). Each example shows ``num_present`` distinct items, a
uniform random subset in random order, each with a value uniform in ``[0, num_values)``, then
a query token. For every order ``r`` let ``top_r`` be the present item it prefers most; the
target is the tuple of their values as one class, ``Σ_r value(top_r) · num_values^(R-1-r)``
(order 0 most significant), at the query (last) position, the only ``loss_mask`` position.
Since ``2 <= num_present < m``, which item is top depends on the subset, so a head serving
order ``r`` must rank every pair of items as ``orders[r]`` does.

Why heads: one query position needs ``R`` rankings of the same keys at once, one per head.
With per-head keys (MHA) a head of key dimension 1 realizes any one order. With keys shared
by all heads (MQA) of dimension ``d``, head ``r`` ranks item ``i`` by ``q_r · k_i`` with the same
``k_i`` for every head: for ``d = 1`` only one order and its reverse are available (the default
orders are not reverses of each other), while ``d >= R`` realizes any ``R`` orders
(``k_i`` = the vector of item ``i``'s ranks). A fair MHA/MQA contrast keeps ``d < R``.

Int inputs ``[B, T]``, ``T = num_present + 1``: item ``i`` with value ``x`` is token
``i · num_values + x``, the query is ``m · num_values``; vocabulary ``m · num_values + 1``.
Classes: ``num_values ** R``. Chance: the probability of the likeliest targets, those whose
``R`` digits are equal: ``E_subset[num_values ** -(number of distinct top items)]`` (computed by
enumerating subsets). It exceeds ``num_values ** -R`` when orders share a top item on some
subset, as the default orders do on ``{0, 2}``.
"""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base

MAX_SUBSETS = 10**6  # the exact chance level enumerates the subsets


@dataclasses.dataclass(frozen=True)
class HeadOrderingConfig:
    orders: tuple[tuple[int, ...], ...] = ((0, 2, 1), (1, 0, 2))
    num_present: int = 2
    num_values: int = 4

    def __post_init__(self):
        try:
            orders = tuple(tuple(order) for order in self.orders)
        except TypeError:
            orders = ()
        m = len(orders[0]) if orders else 0
        ints = all(
            isinstance(i, int | np.integer) and not isinstance(i, bool) for o in orders for i in o
        )
        base.check_that(
            self,
            "orders",
            m >= 3 and ints and all(sorted(o) == list(range(m)) for o in orders),
            "a non-empty sequence of permutations of range(m), m >= 3",
        )
        orders = tuple(tuple(int(i) for i in o) for o in orders)
        object.__setattr__(self, "orders", orders)
        base.check_int(self, "num_present", 2, m - 1)
        base.check_that(
            self,
            "num_present",
            math.comb(m, self.num_present) <= MAX_SUBSETS,
            "with at most 1e6 subsets",
        )
        base.check_int(self, "num_values", 2)

    @property
    def num_items(self) -> int:
        return len(self.orders[0])

    @property
    def spec(self) -> base.TaskSpec:
        subsets = itertools.combinations(range(self.num_items), self.num_present)
        distinct_tops = [len({min(s, key=order.index) for order in self.orders}) for s in subsets]
        return base.TaskSpec(
            seq_len=self.num_present + 1,
            num_classes=self.num_values ** len(self.orders),
            chance_accuracy=float(np.mean(self.num_values ** -np.array(distinct_tops, float))),
            vocab_size=self.num_items * self.num_values + 1,
        )


def generate(key: PRNGKeyArray, batch_size: int, config: HeadOrderingConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    m, k, v = config.num_items, config.num_present, config.num_values
    ranks = np.argsort(np.array(config.orders), axis=1)  # ranks[r, i]: place of item i in order r
    weights = v ** np.arange(len(config.orders) - 1, -1, -1)

    def example(key):
        k_items, k_values = jax.random.split(key)
        items = jax.random.permutation(k_items, m)[:k]
        values = jax.random.randint(k_values, (k,), 0, v)
        top = jnp.argmin(jnp.asarray(ranks)[:, items], axis=1)  # [R] positions of each order's top
        return items * v + values, jnp.sum(values[top] * weights)

    tokens, target = base.split_examples(example, key, batch_size)
    inputs = jnp.concatenate([tokens, jnp.full((batch_size, 1), m * v)], axis=1)
    return base.one_target(inputs.astype(jnp.int32), target)


TASK = base.Task("head_ordering", HeadOrderingConfig, generate)
