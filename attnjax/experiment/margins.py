"""Margins of a verdict rule's decisive comparisons, in standard errors, found by running the
rule unchanged on a traced summary.

Under :func:`decisive`, each point's ``mean`` (and so its ``lower`` and ``upper``, the mean
shifted by the interval's half-width) is a :class:`Traced` float: its value is the same, and
it carries its per-seed values. Every comparison the rule makes with a traced side
(``a.lower > b.upper``, ``s.mean >= SOLVED``) is recorded as a :class:`Comparison`: the
difference of its sides and that difference's standard error over seeds (paired when both
sides have one value per seed, as the points share their seeds; independent otherwise; a
half-width counts as a constant shift). Sums, differences and constant multiples or
quotients of traced values stay traced; other arithmetic gives plain floats. A comparison is
*decisive* if flipping its outcome alone (the rule run again with that one comparison's result
inverted) changes the verdict. Rules that read per-seed ``values`` directly (solved counts,
their own paired statistics) make no traced comparisons.
"""

import contextlib
import contextvars
import dataclasses
import math
import operator
from collections.abc import Callable, Iterator

import numpy as np

from attnjax.experiment.sweep import Stats, Summary, labels

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``left op right`` as a rule evaluated it: ``difference`` (left − right, the mean over
    seeds) and its standard error ``se``; ``held`` its outcome on the committed values."""

    left: str
    op: str
    right: str
    difference: float
    se: float
    held: bool

    @property
    def margin(self) -> float:
        """|difference| / se: ``inf`` for a nonzero difference without spread, 0 for an exact
        tie, ``nan`` when undefined (one seed, a non-finite value)."""
        if not (math.isfinite(self.difference) and math.isfinite(self.se)):
            return math.nan
        if self.se == 0:
            return math.inf if self.difference else 0.0
        return abs(self.difference) / self.se

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclasses.dataclass
class _Recorder:
    flip: int | None
    comparisons: list[Comparison] = dataclasses.field(default_factory=list)


_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
    "margins", default=None
)


class Traced(float):
    """A float that is the mean of ``seeds`` (one value per seed) and is named ``name``
    (``"heads=2 lower"``); comparisons under :func:`recording` are recorded."""

    seeds: np.ndarray
    name: str

    def __new__(cls, seeds, name: str, value: float | None = None) -> "Traced":
        seeds = np.asarray(seeds, float)
        self = super().__new__(cls, float(seeds.mean()) if value is None else value)
        self.seeds, self.name = seeds, name
        return self

    def _combine(self, other, sign: float, symbol: str):
        if isinstance(other, Traced):
            if len(other.seeds) != len(self.seeds):
                return float.__add__(float(self), sign * float(other))
            return Traced(self.seeds + sign * other.seeds, f"{self.name} {symbol} {other.name}",
                          float.__add__(float(self), sign * float(other)))  # fmt: skip
        if isinstance(other, int | float):
            value = float.__add__(float(self), sign * float(other))
            return Traced(self.seeds + sign * float(other), f"{self.name} {symbol} {other:g}",
                          value)  # fmt: skip
        return NotImplemented

    def __add__(self, other):
        return self._combine(other, 1.0, "+")

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1.0, "−")

    def __rsub__(self, other):
        result = self.__neg__()._combine(other, 1.0, "+")
        return result if result is NotImplemented else _renamed(result, f"{other:g} − {self.name}")

    def __neg__(self):
        return Traced(-self.seeds, f"−{self.name}", -float(self))

    def __mul__(self, other):
        if isinstance(other, int | float) and not isinstance(other, Traced):
            return Traced(self.seeds * other, f"{other:g}·{self.name}", float(self) * other)
        return float(self) * float(other) if isinstance(other, int | float) else NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, int | float) and not isinstance(other, Traced):
            return Traced(self.seeds / other, f"{self.name}/{other:g}", float(self) / other)
        return float(self) / float(other) if isinstance(other, int | float) else NotImplemented

    def _compare(self, other, op: str) -> bool:
        held = _OPS[op](float(self), float(other))
        recorder = _RECORDER.get()
        if recorder is None:
            return held
        flipped = len(recorder.comparisons) == recorder.flip
        difference, se = _difference(self, other)
        right = other.name if isinstance(other, Traced) else f"{float(other):.4g}"
        recorder.comparisons.append(Comparison(self.name, op, right, difference, se, held))
        return held != flipped

    def __lt__(self, other):
        return self._compare(other, "<")

    def __le__(self, other):
        return self._compare(other, "<=")

    def __gt__(self, other):
        return self._compare(other, ">")

    def __ge__(self, other):
        return self._compare(other, ">=")

    __hash__ = float.__hash__


def _renamed(value: Traced, name: str) -> Traced:
    return Traced(value.seeds, name, float(value))


def _difference(left: Traced, right) -> tuple[float, float]:
    """left − right and its standard error over seeds (paired when both have a value per seed
    for the same seeds; else the two errors combined as independent)."""
    if isinstance(right, Traced) and len(right.seeds) == len(left.seeds):
        return float(left) - float(right), _se(left.seeds - right.seeds)
    if isinstance(right, Traced):
        return float(left) - float(right), math.hypot(_se(left.seeds), _se(right.seeds))
    return float(left) - float(right), _se(left.seeds)


def _se(values: np.ndarray) -> float:
    if len(values) < 2:
        return math.nan
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


@contextlib.contextmanager
def recording(flip: int | None = None) -> Iterator[list[Comparison]]:
    """Within it, comparisons of traced values are appended to the yielded list; ``flip``: the
    index of one comparison whose outcome is inverted."""
    recorder = _Recorder(flip)
    token = _RECORDER.set(recorder)
    try:
        yield recorder.comparisons
    finally:
        _RECORDER.reset(token)


class TracedStats(Stats):
    """:class:`Stats` whose ``mean`` is :class:`Traced` (named ``"<point> mean"``), and so
    its ``lower`` and ``upper`` (named ``"<point> lower"``, ``"<point> upper"``)."""

    __slots__ = ()

    @property
    def lower(self) -> Traced:
        return _renamed(super().lower, self.mean.name.replace(" mean", " lower"))

    @property
    def upper(self) -> Traced:
        return _renamed(super().upper, self.mean.name.replace(" mean", " upper"))


def traced(summary: Summary) -> Summary:
    """``summary`` with every point's stats a :class:`TracedStats` (values unchanged)."""
    names = labels([p for p, _ in summary])
    return Summary([(p, TracedStats(Traced(s.values, f"{n} mean", s.mean), *s[1:]))
                    for (p, s), n in zip(summary, names, strict=True)])  # fmt: skip


def decisive(rule: Callable, summary: Summary) -> tuple[Comparison, ...]:
    """The comparisons of ``rule`` on ``summary`` (traced by :func:`traced`) whose outcome,
    flipped alone, changes its verdict. A flipped run that raises counts as not decisive."""
    traced_summary = traced(summary)
    with recording() as comparisons:
        verdict = rule(traced_summary)[0]
    found = []
    for i, comparison in enumerate(list(comparisons)):
        with recording(flip=i):
            try:
                flipped = rule(traced_summary)[0]
            except Exception:  # an impossible state the flip made
                continue
        if flipped != verdict:
            found.append(comparison)
    return tuple(found)


def smallest(comparisons: tuple[Comparison, ...]) -> Comparison | None:
    """The comparison of smallest defined margin, or None."""
    defined = [c for c in comparisons if not math.isnan(c.margin)]
    return min(defined, key=lambda c: c.margin) if defined else None
