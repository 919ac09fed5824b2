"""Experiments: a base config, a list of override points, a metric and a verdict rule declared
before anything runs; ``sweep`` trains every point (all seeds and learning rates vectorized)
and writes the table, the plot and the verdict.

``<out>/points/<id>/`` is each point's run folder; ``<out>/results.csv`` has one row per point
and seed at the point's best learning rate (chosen on the ``valid`` split, reported on
``test``); ``<out>/report.md`` has mean ± 95% interval per point, ``<out>/summary.png`` and the
verdict: *supported*, *refuted* or *inconclusive*.
"""

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from attnjax.experiment import report, storage
from attnjax.experiment.config import ExperimentConfig, with_overrides
from attnjax.experiment.run import train_and_evaluate

VERDICTS = ("supported", "refuted", "inconclusive")


class Stats(NamedTuple):
    """A point's metric over seeds at its best learning rate."""

    mean: float
    half_width: float  # of the 95% interval
    values: tuple[float, ...]
    learning_rate: float
    params: int

    @property
    def lower(self) -> float:
        """Lower end of the 95% interval (the mean for a single seed)."""
        return self.mean - (0.0 if math.isnan(self.half_width) else self.half_width)

    @property
    def upper(self) -> float:
        """Upper end of the 95% interval (the mean for a single seed)."""
        return self.mean + (0.0 if math.isnan(self.half_width) else self.half_width)


Summary = dict[str, Stats]  # point label -> stats


@dataclasses.dataclass(frozen=True)
class Experiment:
    """``metric`` is a final-metric column of ``results.csv`` reported on ``test`` (e.g.
    ``"accuracy"``); ``verdict(summary) -> (verdict, reason)`` reads the points' stats by
    label. ``learning_rates``, when given, are all trained (vectorized) and each point is
    compared at its best one."""

    name: str
    claim: str
    base: ExperimentConfig
    points: tuple[Mapping[str, Any], ...]
    metric: str
    verdict: Callable[[Summary], tuple[str, str]]
    learning_rates: tuple[float, ...] | None = None
    higher_is_better: bool = True


def grid(**axes: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """The Cartesian product of override axes, ``grid(**{"model.heads": [1, 2]})``; a key may
    hold several dotted fields joined by ``+`` with tuple values, varied together."""
    points = []
    for combo in itertools.product(*axes.values()):
        point = {}
        for key, value in zip(axes, combo, strict=True):
            fields = key.split("+")
            point |= dict(zip(fields, value, strict=True)) if len(fields) > 1 else {key: value}
        points.append(point)
    return tuple(points)


def label(point: Mapping[str, Any]) -> str:
    """A short readable name: ``score=additive heads=2``."""
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()) or "base"


def sweep(
    experiment: Experiment,
    out: str | Path,
    *,
    num_seeds: int = 5,
    overwrite: bool = False,
    workers: int = 2,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[Summary, str, str]:
    """Train every point (``workers`` at a time); write results, report and plot; return
    ``(summary, verdict, reason)``. ``progress(point, step, total)`` follows each point."""
    out = Path(out)

    def train_point(i: int, point: Mapping[str, Any]) -> list[dict[str, Any]]:
        name = label(point)
        return train_and_evaluate(
            with_overrides(experiment.base, {**point, "name": name}),
            out / "points" / f"{i:02d}_{re.sub(r'[^A-Za-z0-9=.-]+', '_', name)}",
            num_seeds=num_seeds,
            learning_rates=experiment.learning_rates,
            fields={"point": name} | {k.rsplit(".", 1)[-1]: v for k, v in point.items()},
            overwrite=overwrite,
            progress=functools.partial(progress, name) if progress else None,
        )

    # Points compile and run in parallel threads: XLA compiles one program on one core.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        all_rows = list(pool.map(train_point, range(len(experiment.points)), experiment.points))
    best_rows, summary = [], {}
    for point, rows in zip(experiment.points, all_rows, strict=True):
        best = _best_learning_rate(rows, experiment)
        chosen = [r for r in rows if r["learning_rate"] == best]
        best_rows += chosen
        values = tuple(r[f"test_{experiment.metric}"] for r in chosen)
        summary[label(point)] = Stats(*report.mean_ci95(values), values, best, chosen[0]["params"])
    verdict, reason = experiment.verdict(summary)
    if verdict not in VERDICTS:
        raise ValueError(f"verdict: expected one of {VERDICTS}, got {verdict!r}")
    storage.write_csv(out / "results.csv", best_rows)
    plot_summary(summary, experiment, out / "summary.png")
    (out / "report.md").write_text(sweep_report(experiment, summary, verdict, reason, num_seeds))
    return summary, verdict, reason


def _best_learning_rate(rows: list[dict[str, Any]], experiment: Experiment) -> float:
    sign = 1 if experiment.higher_is_better else -1
    by_lr = {}
    for r in rows:
        by_lr.setdefault(r["learning_rate"], []).append(r[f"valid_{experiment.metric}"])
    return max(by_lr, key=lambda lr: sign * sum(by_lr[lr]) / len(by_lr[lr]))


def summary_table(summary: Summary, metric: str) -> str:
    rows = [
        [name, s.params, f"{s.learning_rate:g}", report.fmt(s.mean, s.half_width), len(s.values)]
        for name, s in summary.items()
    ]
    return report.markdown_table(["point", "params", "lr", f"test {metric}", "seeds"], rows)


def sweep_report(
    experiment: Experiment, summary: Summary, verdict: str, reason: str, num_seeds: int
) -> str:
    lrs = experiment.learning_rates
    lr_note = (
        f"Each point at its best learning rate of {list(lrs)} (chosen on the valid split)."
        if lrs
        else f"Learning rate {experiment.base.optim.learning_rate:g} for every point."
    )
    return (
        f"# {experiment.name}\n\n**Claim.** {experiment.claim}\n\n"
        f"{num_seeds} seeds per point; mean ± 95% interval (Student t). {lr_note}\n\n"
        f"{summary_table(summary, experiment.metric)}\n![summary](summary.png)\n\n"
        f"**Verdict: {verdict}.** {reason}\n"
    )


def plot_summary(summary: Summary, experiment: Experiment, path: Path) -> None:
    """One bar per point: mean metric with its 95% interval and the seeds as dots."""
    names = list(summary)
    fig, ax = report.new_figure(figsize=(7, 0.35 * len(names) + 1.2))
    means = [summary[n].mean for n in names]
    errors = [0.0 if math.isnan(summary[n].half_width) else summary[n].half_width for n in names]
    ax.barh(range(len(names)), means, xerr=errors, color="#8fb3d9", capsize=3)
    for i, n in enumerate(names):
        ax.plot(summary[n].values, [i] * len(summary[n].values), "k.", ms=3)
    if experiment.metric == "accuracy":
        chance = experiment.base.task.spec.chance_accuracy
        ax.axvline(chance, color="grey", ls="--", lw=1, label=f"chance {chance:.3g}")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"test {experiment.metric} (mean ± 95% interval; dots: seeds)")
    ax.set_title(experiment.name)
    ax.grid(axis="x", alpha=0.3)
    report.save_figure(fig, path)
