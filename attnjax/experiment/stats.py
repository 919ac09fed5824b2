"""Statistics that fit a claim's statement, from per-seed values (a point's :class:`Stats` or a
sequence, one value per seed):

- one-sided confidence bounds for one-sided statements (``lower(a) > bar``: the mean is above
  the bar at 95% one-sided confidence), where a two-sided interval would spend half its error
  on the side the statement does not make;
- paired bounds of a difference for points that share their seeds and data (``a − b`` per
  seed), tighter than comparing two intervals;
- equivalence (two one-sided tests) for "no effect" statements, within a declared margin;
- power: the chance that ``n`` seeds establish a declared effect, given a pilot's spread.

Given :class:`Stats`, the bounds are built from ``stats.mean``, so under
:func:`attnjax.experiment.margins.decisive` the rule's comparisons of them are traced and the
audit reports their margins (a paired bound traces the paired difference).
"""

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from attnjax.experiment.margins import Traced
from attnjax.experiment.sweep import Stats

CONFIDENCE = 0.95
Values = Stats | Sequence[float] | np.ndarray


@functools.cache
def _t(confidence: float, df: int) -> float:
    return float(scipy_stats.t.ppf(confidence, df=df))


def _mean_and_values(x: Values) -> tuple[float, np.ndarray]:
    if isinstance(x, Stats):
        return x.mean, np.asarray(x.values, float)
    values = np.asarray(x, float)
    return float(values.mean()), values


def _half(values: np.ndarray, confidence: float) -> float:
    """The one-sided bound's distance from the mean (0 for one value: no spread is known)."""
    n = len(values)
    return 0.0 if n < 2 else _t(confidence, n - 1) * float(values.std(ddof=1)) / math.sqrt(n)


def _named(bound: float, mean: float, name: str) -> float:
    """``bound`` named after its mean for the audit's margins (``"heads=1 one-sided lower"``)."""
    if isinstance(bound, Traced):
        return Traced(bound.seeds, f"{mean.name.replace(' mean', '')} {name}", float(bound))
    return bound


def lower(x: Values, confidence: float = CONFIDENCE) -> float:
    """One-sided lower confidence bound of the mean over seeds: ``lower(x) > bar`` establishes
    "the mean exceeds bar" at ``confidence``."""
    mean, values = _mean_and_values(x)
    return _named(mean - _half(values, confidence), mean, "one-sided lower")


def upper(x: Values, confidence: float = CONFIDENCE) -> float:
    """One-sided upper confidence bound of the mean over seeds: ``upper(x) < bar`` establishes
    "the mean is below bar" at ``confidence``."""
    mean, values = _mean_and_values(x)
    return _named(mean + _half(values, confidence), mean, "one-sided upper")


def _paired(a: Values, b: Values) -> tuple[float, np.ndarray]:
    mean_a, values_a = _mean_and_values(a)
    mean_b, values_b = _mean_and_values(b)
    if len(values_a) != len(values_b):
        raise ValueError(
            f"paired: the points need one value per shared seed, got {len(values_a)} and "
            f"{len(values_b)}"
        )
    return mean_a - mean_b, values_a - values_b


def paired_lower(a: Values, b: Values, confidence: float = CONFIDENCE) -> float:
    """One-sided lower bound of the mean of ``a − b`` over shared seeds (seed i of ``a`` with
    seed i of ``b``): ``paired_lower(a, b) > 0`` establishes that a exceeds b."""
    mean, differences = _paired(a, b)
    return _named(mean - _half(differences, confidence), mean, "paired lower")


def paired_upper(a: Values, b: Values, confidence: float = CONFIDENCE) -> float:
    """One-sided upper bound of the mean of ``a − b`` over shared seeds."""
    mean, differences = _paired(a, b)
    return _named(mean + _half(differences, confidence), mean, "paired upper")


def equivalent(a: Values, b: Values, margin: float, confidence: float = CONFIDENCE) -> bool:
    """Two one-sided tests over shared seeds: the mean of ``a − b`` lies within ``±margin`` at
    ``confidence`` on each side ("no effect" larger than ``margin``). Few or noisy seeds give
    False, never a tie by default."""
    if margin <= 0:
        raise ValueError(f"equivalent: margin must be > 0, got {margin}")
    return paired_lower(a, b, confidence) > -margin and paired_upper(a, b, confidence) < margin


def power(n: int, effect: float, sd: float, confidence: float = CONFIDENCE) -> float:
    """The chance that ``n`` seeds whose values spread by ``sd`` establish a true mean effect
    ``effect`` (> 0) with a one-sided bound at ``confidence``: a one-sample (or paired) t-test's
    power, from the noncentral t distribution."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if effect > 0 else 0.0
    df, shift = n - 1, effect / (sd / math.sqrt(n))
    return float(scipy_stats.nct.sf(_t(confidence, df), df, shift))


def seeds_needed(
    effect: float, sd: float, target: float = 0.8, confidence: float = CONFIDENCE, most: int = 200
) -> int | None:
    """The fewest seeds whose :func:`power` reaches ``target`` (None beyond ``most``)."""
    return next((n for n in range(2, most + 1) if power(n, effect, sd, confidence) >= target), None)
