"""Order-blind readouts: what a predictor that sees only the multiset of the input tokens up to
and including a scored position (their order discarded; its size gives the position) can reach.

A task's ``bag_of_tokens_accuracy`` is the accuracy at ``loss_mask`` positions of the
Bayes-optimal such predictor: at each position ``t`` and multiset ``M`` it picks the ``y``
maximizing ``P(scored at t, target = y | M)``, so its accuracy is
``Σ_t E[max_y P(scored at t, target = y | M_t)] / Σ_t P(scored at t)`` (the metric's ratio of
expectations). No order-blind predictor does better; a model above it uses order.
"""

import functools
from typing import NamedTuple

import numpy as np
from jaxtyping import Float
from scipy import stats


class Estimate(NamedTuple):
    """A Monte Carlo estimate over ``draws`` examples: ``value`` ± ``se`` (one standard
    error)."""

    value: float
    se: float
    draws: int


@functools.cache
def mean_max_counts(draws: int, categories: int) -> Float[np.ndarray, " N"]:
    """``E[max_c n_c]`` for counts ``n ~ Multinomial(r, uniform over categories)``, for each
    ``r`` in ``[0, draws]`` (``N = draws + 1``), exact up to rounding: ``E[max] = Σ_m P(max > m)``,
    and ``P(max <= m)`` follows the categories in turn, each taking a ``Binomial(left, 1 /
    categories left)`` share of the draws left (cost ``categories · N³``)."""
    r = np.arange(draws + 1)
    taken = r[:, None] - r[None, :]  # [left before, left after]: what this category takes
    caps = r[:, None, None]
    fits = (taken[None] >= 0) & (taken[None] <= caps)  # [cap, before, after]
    at_most = (r[None, :] <= caps[:, :, 0]).astype(float)  # the last category takes the rest
    for left in range(2, categories + 1):
        share = stats.binom.pmf(taken, r[:, None], 1 / left)
        at_most = np.einsum("mba,ma->mb", fits * share[None], at_most)
    return np.sum(1 - at_most, axis=0)


def ratio(numerators: Float[np.ndarray, " D"], denominators: Float[np.ndarray, " D"]) -> Estimate:
    """``Σ numerators / Σ denominators`` over ``D`` independent draws, with its delta-method
    standard error."""
    value = numerators.sum() / denominators.sum()
    residuals = numerators - value * denominators
    se = residuals.std(ddof=1) / np.sqrt(len(residuals)) / denominators.mean()
    return Estimate(float(value), float(se), len(residuals))
