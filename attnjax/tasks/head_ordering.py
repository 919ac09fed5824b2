"""Head ordering: report, for each of several preference orders, the value of its top item.

There are ``m = num_items`` items and ``R = num_orders`` fixed preference orders over them
(:attr:`HeadOrderingConfig.orders`, most preferred first): order 0 ranks items by index,
orders ``1..R-1`` are permutations drawn once from ``numpy.random.default_rng(0)`` (on 3
items, 0≻1≻2 and 2≻0≻1: the claim's 1≻3≻2 and 2≻1≻3 with items renamed). Each
example shows ``num_present`` distinct items, a uniform random subset in random order, each
with a value uniform in ``[0, num_values)``, then a query token. For every order ``r`` let
``top_r`` be the present item it prefers most; the target is the tuple of their values as one
class, ``Σ_r value(top_r) · num_values^(R-1-r)`` (order 0 most significant), at the query
(last) position, the only ``loss_mask`` position. With ``num_present = 2`` every example is
one pair, and answering order ``r`` is comparing the pair under it.

Float inputs ``[B, T, m + num_values + 1]``, ``T = num_present + 1``; per token
``[one_hot(item), one_hot(value), is_query]`` (the query's first ``m + num_values`` features
are 0). Item and value are separate feature channels, so a linear map of a token (a key) can
carry the item alone, and a sum over tokens (uniform attention) loses which value belongs to
which item: a readout of the item set and the value multiset alone reaches at most
``spec.baselines["bag"]`` (their Bayes accuracy, by enumeration). Only attention that weights
the right item binds a value to it.

Why heads: one query position needs ``R`` rankings of the same keys at once, one per head.
With per-head keys (MHA) a head of key dimension 1 realizes any one order. With keys shared
by all heads (MQA) of dimension ``d``, head ``r`` ranks item ``i`` by ``q_r · k_i`` with the same
``k_i`` for every head: for ``d = 1`` only one order and its reverse are available, while
``d >= R`` realizes any ``R`` orders (``k_i`` = the vector of item ``i``'s ranks). On few
items a readout can make up for shared keys by learning, per subset, which attended item
answers which order (a lookup, not a ranking); many items make that lookup large.

Classes: ``num_values ** R``. Chance: the probability of the likeliest targets, those whose
``R`` digits are equal: ``E_subset[num_values ** -(number of distinct top items)]``.
"""

import dataclasses
import functools
import itertools
import math
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base

MAX_CASES = 10**6  # the bag ceiling enumerates subsets × value assignments


@dataclasses.dataclass(frozen=True)
class HeadOrderingConfig:
    num_items: int = 16
    num_orders: int = 2
    num_present: int = 2
    num_values: int = 4

    def __post_init__(self):
        base.check_int(self, "num_items", 3)
        base.check_int(self, "num_orders", 1)
        base.check_int(self, "num_present", 2, self.num_items - 1)
        base.check_int(self, "num_values", 2)
        cases = math.comb(self.num_items, self.num_present) * self.num_values**self.num_present
        base.check_that(
            self, "num_present", cases <= MAX_CASES, "with at most 1e6 subsets × value tuples"
        )

    @functools.cached_property
    def orders(self) -> tuple[tuple[int, ...], ...]:
        """``R`` permutations of ``range(m)``, most preferred item first."""
        rng = np.random.default_rng(0)
        drawn = [
            tuple(int(i) for i in rng.permutation(self.num_items))
            for _ in range(1, self.num_orders)
        ]
        return (tuple(range(self.num_items)), *drawn)

    def tops(self, subset: tuple[int, ...]) -> tuple[int, ...]:
        """Each order's most preferred item of ``subset``."""
        return tuple(min(subset, key=order.index) for order in self.orders)

    @property
    def spec(self) -> base.TaskSpec:
        m, n, v = self.num_items, self.num_present, self.num_values
        subsets = list(itertools.combinations(range(m), n))
        distinct_tops = np.array([len(set(self.tops(s))) for s in subsets], float)
        return base.TaskSpec(
            seq_len=n + 1,
            num_classes=v**self.num_orders,
            chance_accuracy=float(np.mean(v**-distinct_tops)),
            num_features=m + v + 1,
            baselines={"bag": self._bag_ceiling(subsets)},
        )

    def _bag_ceiling(self, subsets: list[tuple[int, ...]]) -> float:
        """Bayes accuracy given the item set and the value multiset, not which value is whose:
        per (set, multiset), the count of its likeliest target, summed over all cases."""
        counts: dict[tuple, Counter] = {}
        for subset in subsets:
            tops = [subset.index(t) for t in self.tops(subset)]
            for values in itertools.product(range(self.num_values), repeat=len(subset)):
                bag = (subset, tuple(sorted(values)))
                counts.setdefault(bag, Counter())[tuple(values[t] for t in tops)] += 1
        total = len(subsets) * self.num_values**self.num_present
        return sum(max(c.values()) for c in counts.values()) / total


def generate(key: PRNGKeyArray, batch_size: int, config: HeadOrderingConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    m, k, v = config.num_items, config.num_present, config.num_values
    ranks = np.argsort(np.array(config.orders), axis=1)  # ranks[r, i]: place of item i in order r
    weights = v ** np.arange(config.num_orders - 1, -1, -1)

    def example(key):
        k_items, k_values = jax.random.split(key)
        items = jax.random.permutation(k_items, m)[:k]
        values = jax.random.randint(k_values, (k,), 0, v)
        top = jnp.argmin(jnp.asarray(ranks)[:, items], axis=1)  # [R] positions of each order's top
        tokens = jnp.concatenate(
            [jax.nn.one_hot(items, m), jax.nn.one_hot(values, v), jnp.zeros((k, 1))], axis=1
        )
        return tokens, jnp.sum(values[top] * weights)

    tokens, target = base.split_examples(example, key, batch_size)
    query = jnp.zeros((batch_size, 1, m + v + 1)).at[:, :, -1].set(1.0)
    return base.one_target(jnp.concatenate([tokens, query], axis=1), target)


TASK = base.Task("head_ordering", HeadOrderingConfig, generate)
