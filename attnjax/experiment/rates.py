"""A learning-rate grid that grows until every point's best rate is interior:
``Experiment(learning_rates=AutoRates((1e-3, 3e-3, 1e-2), factor=3, bounds=(1e-4, 1.0)))``.

Every point first trains ``start``. While a point's best rate (chosen on the valid split) is the
smallest of its grid, the rate ÷ ``factor`` is added; the largest, × ``factor``; until the best
rate is interior or the next rate would leave ``bounds``. The rates added are in
``results.csv`` (each point's rows), so the report recomputes from the record; the report
names them (:func:`extension_note`).
"""

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class AutoRates:
    """``start``: the grid every point trains first (two rates or more); ``factor`` (> 1): the
    step between the rates added; ``bounds``: ``(low, high)``, the rates never leave it.
    Called with a point's overrides it gives ``start`` (the grid a sweep trains first)."""

    start: tuple[float, ...]
    factor: float = 3.0
    bounds: tuple[float, float] = (1e-5, 1.0)

    def __post_init__(self):
        if self.factor <= 1:
            raise ValueError(f"AutoRates: factor must be > 1, got {self.factor}")
        low, high = self.bounds
        if len(self.start) < 2 or not all(low <= r <= high for r in self.start):
            raise ValueError(
                f"AutoRates: start {self.start} must hold two or more rates within {self.bounds}"
            )

    def __call__(self, point: Mapping[str, Any]) -> tuple[float, ...]:
        return tuple(self.start)

    def next_rate(self, rates: Iterable[float], best: float) -> float | None:
        """The rate to add to a grid ``rates`` whose best is ``best``: beyond the edge ``best``
        sits at, if within the bounds; None if ``best`` is interior or the bound is reached."""
        rates = sorted(rates)
        if len(rates) > 1 and rates[0] < best < rates[-1]:
            return None
        low, high = self.bounds
        below, above = _round(rates[0] / self.factor), _round(rates[-1] * self.factor)
        if best <= rates[0] and below >= low * (1 - 1e-9):
            return below
        if best >= rates[-1] and above <= high * (1 + 1e-9):
            return above
        return None

    def added(self, rates: Iterable[float]) -> tuple[float, ...]:
        """The rates of a point's grid that ``start`` does not hold, in order."""
        start = set(self.start)
        return tuple(sorted(r for r in rates if r not in start))


AUTO = AutoRates((1e-3, 3e-3, 1e-2), factor=3.0, bounds=(1e-5, 1.0))  # learning_rates="auto"


def _round(rate: float) -> float:
    """Three significant digits: ``1e-3 / 3`` → ``0.000333``."""
    return float(f"{rate:.3g}")


def extension_note(auto: AutoRates, added: Mapping[str, tuple[float, ...]]) -> str:
    """The report's sentence on the grid: where it started, the rule, and the rates each point
    added (``added``: point label → its rates beyond ``start``)."""
    extended = [f"{name}: {', '.join(f'{r:g}' for r in rates)}"
                for name, rates in added.items() if rates]  # fmt: skip
    grown = "; ".join(extended) if extended else "none needed it"
    return (
        f"Each point at the best learning rate of its grid (chosen on the valid split); every "
        f"grid starts at {list(auto.start)} and is extended by a factor of {auto.factor:g} "
        f"while its best rate is at an edge, within [{auto.bounds[0]:g}, {auto.bounds[1]:g}]. "
        f"Rates added: {grown}."
    )
