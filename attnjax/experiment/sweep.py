"""Experiments: a base config, a list of override points, a metric and a verdict rule declared
before anything runs; ``sweep`` trains every point (all seeds and learning rates vectorized),
applies the rule and returns the report's body.

``<out>/points/<id>/`` is each point's run folder; ``<out>/results.csv`` has one row per point,
seed and learning rate, ``chosen`` marking each point's best rate (chosen on the ``valid``
split, reported on ``test``; each seed draws its own evaluation batches); ``<out>/summary.png``
plots the points. The body (:class:`Outcome`) has mean ± 95% interval per point, solved-seed
counts, the metric against learning rate and the verdict: *supported*, *refuted* or
*inconclusive*; the command line writes it to ``report.md`` under the verdict lines.
"""

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import jax

from attnjax.experiment import report, storage
from attnjax.experiment.config import ExperimentConfig, with_overrides
from attnjax.experiment.parts import Check, Part, declared_notes
from attnjax.experiment.rates import AUTO, AutoRates, extension_note
from attnjax.experiment.run import check_workdir, train_and_evaluate

VERDICTS = ("supported", "refuted", "inconclusive")
# One grid for every point, a grid per point from its overrides, or a grid that grows
# (:class:`attnjax.experiment.rates.AutoRates`).
LearningRates = tuple[float, ...] | Callable[[Mapping[str, Any]], tuple[float, ...]] | AutoRates


class Stats(NamedTuple):
    """A point's test metric over seeds at its best learning rate, and every rate's means."""

    mean: float
    half_width: float  # of the 95% Student-t interval
    values: tuple[float, ...]  # one per seed
    learning_rate: float
    params: int
    by_learning_rate: tuple[tuple[float, float, float], ...] = ()  # (rate, valid, test) means

    @property
    def lower(self) -> float:
        """Lower end of the 95% interval (the mean for a single seed)."""
        return self.mean - (0.0 if math.isnan(self.half_width) else self.half_width)

    @property
    def upper(self) -> float:
        """Upper end of the 95% interval (the mean for a single seed)."""
        return self.mean + (0.0 if math.isnan(self.half_width) else self.half_width)

    @property
    def at_edge(self) -> bool:
        """The best rate, and every rate tied with it on validation, is the smallest or the
        largest of a grid of several."""
        rates = [lr for lr, _, _ in self.by_learning_rate]
        best = dict((lr, v) for lr, v, _ in self.by_learning_rate).get(self.learning_rate)
        tied = [lr for lr, v, _ in self.by_learning_rate if v == best]
        return len(rates) > 1 and not any(min(rates) < lr < max(rates) for lr in tied)

    def solved(self, threshold: float) -> int:
        """How many seeds reach ``threshold`` (≥; a metric where higher is better). Bimodal
        outcomes are reported as ``k`` of ``n``."""
        return sum(v >= threshold for v in self.values)


def combine(parts: Iterable[str]) -> str:
    """A claim's verdict from the verdicts of its parts: *refuted* if any part is, *supported*
    if every part is, else *inconclusive*."""
    parts = list(parts)
    if "refuted" in parts:
        return "refuted"
    return "supported" if all(p == "supported" for p in parts) else "inconclusive"


def point_key(point: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A point's full overrides as a hashable, order-free key."""
    return tuple(sorted(point.items()))


class Summary:
    """Each point's :class:`Stats`, looked up by the point's full overrides:
    ``summary[{"model.score": "dot", "model.heads": 1}]``. Iteration gives ``(point, stats)``
    in the experiment's order."""

    def __init__(self, entries: Sequence[tuple[Mapping[str, Any], Stats]]):
        self._entries = [(dict(p), s) for p, s in entries]
        self._index = {point_key(p): s for p, s in self._entries}
        if len(self._index) != len(self._entries):
            raise ValueError("points: two points have the same overrides")

    def __getitem__(self, point: Mapping[str, Any]) -> Stats:
        try:
            return self._index[point_key(point)]
        except KeyError:
            known = "; ".join(str(p) for p, _ in self._entries)
            raise KeyError(f"no point with overrides {dict(point)}; points: {known}") from None

    def __contains__(self, point: Mapping[str, Any]) -> bool:
        return point_key(point) in self._index

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Stats]]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def labels(self) -> dict[str, Stats]:
        """Stats by each point's display label (:func:`labels`)."""
        names = labels([p for p, _ in self._entries])
        return dict(zip(names, (s for _, s in self._entries), strict=True))


@dataclasses.dataclass(frozen=True)
class Experiment:
    """``claim_id`` names the claim judged (``"E1"``); ``metric`` is a final-metric column of
    ``results.csv`` reported on ``test`` (e.g. ``"accuracy"``); ``verdict(summary) ->
    (verdict, reason)`` looks the points' stats up by their overrides. ``learning_rates``,
    when given, are all trained (vectorized) and each point is compared at its best one; a
    function of the point's overrides gives each point its own grid (e.g. one per optimizer);
    an :class:`AutoRates` grows each point's grid until its best rate is interior (``"auto"``:
    :data:`attnjax.experiment.rates.AUTO`).
    ``solved_at``: a threshold whose solved-seed counts the report shows. ``checks``: parts of
    the claim that hold by construction, reported pass/fail and never counted in the verdict;
    ``parts``: the parts judged, *can* or *does*, with witnesses (:mod:`attnjax.experiment.
    parts`). ``pilot_seeds``: seeds used while designing the experiment; a published record's
    seeds must not include them (:func:`check_pilot`)."""

    name: str
    claim_id: str
    claim: str
    base: ExperimentConfig
    points: tuple[Mapping[str, Any], ...]
    metric: str
    verdict: Callable[[Summary], tuple[str, str]]
    learning_rates: LearningRates | str | None = None  # "auto": rates.AUTO
    higher_is_better: bool = True
    solved_at: float | None = None
    checks: tuple[Check, ...] = ()
    parts: tuple[Part, ...] = ()
    pilot_seeds: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.learning_rates, str):
            if self.learning_rates != "auto":
                raise ValueError(
                    f"learning_rates: {self.learning_rates!r}; the one named grid is 'auto' "
                    f"(an AutoRates from {list(AUTO.start)})"
                )
            object.__setattr__(self, "learning_rates", AUTO)

    def rates(self, point: Mapping[str, Any]) -> tuple[float, ...] | None:
        """The learning rates trained at ``point``."""
        rates = self.learning_rates
        return rates(point) if callable(rates) else rates


class Outcome(NamedTuple):
    """What a sweep concluded: the stats and the verdict on ``claim_id``, the report's
    markdown body (without the verdict lines) and each point's run folder."""

    summary: Summary
    claim_id: str
    verdict: str
    reason: str
    body: str
    folders: tuple[Path, ...]


def seeds(experiment: Experiment, num_seeds: int) -> tuple[int, ...]:
    """Every seed the sweep trains: ``num_seeds`` from each point's ``train.seed``."""
    starts = {with_overrides(experiment.base, p).train.seed for p in experiment.points}
    return tuple(sorted({s for start in starts for s in range(start, start + num_seeds)}))


def check_pilot(experiment: Experiment, num_seeds: int) -> None:
    """A ``ValueError`` if the record's seeds (:func:`seeds`) include a pilot seed."""
    shared = sorted(set(seeds(experiment, num_seeds)) & set(experiment.pilot_seeds))
    if shared:
        raise ValueError(
            f"publish: {experiment.name}'s record would train its pilot seeds {shared} "
            f"(pilot_seeds {list(experiment.pilot_seeds)}, record seeds "
            f"{list(seeds(experiment, num_seeds))}); a published record needs fresh seeds: "
            f"set --set train.seed=<a seed past the pilot's>"
        )


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


def label(point: Mapping[str, Any], full: bool = False) -> str:
    """A short readable name, ``score=additive heads=2`` (``full``: dotted field names)."""
    return " ".join(f"{k if full else k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()) or (
        "base"
    )


def labels(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Short labels, or full ones where short labels would collide (``task.seed`` and
    ``train.seed``)."""
    short = [label(p) for p in points]
    names = [[k.rsplit(".", 1)[-1] for k in p] for p in points]
    full = len(set(short)) < len(short) or any(len(set(n)) < len(n) for n in names)
    return [label(p, full=full) for p in points]


def sweep(
    experiment: Experiment,
    out: str | Path,
    *,
    num_seeds: int = 5,
    overwrite: bool = False,
    workers: int = 2,
    progress: Callable[[str, int, int, float], None] | None = None,
    smoke: bool = False,
) -> Outcome:
    """Train every point (:func:`train_points`, ``progress(point, step, total, loss)``
    following each); write ``results.csv`` and ``summary.png``; return the :class:`Outcome`.
    ``smoke`` (a run that only checks the code runs) says so in the figures' titles."""
    out = Path(out)
    rows, folders = train_points(
        experiment, out, num_seeds=num_seeds, overwrite=overwrite, workers=workers,
        progress=progress, smoke=smoke,
    )  # fmt: skip
    summary, table = summarize(experiment, rows)
    verdict, reason = judge(experiment, summary)
    if jax.process_index() == 0:
        storage.write_csv(out / "results.csv", table)
        plot_summary(summary, experiment, out / "summary.png", smoke=smoke)
    body = sweep_report(experiment, summary, verdict, reason, num_seeds)
    return Outcome(summary, experiment.claim_id, verdict, reason, body, folders)


def train_points(
    experiment: Experiment,
    out: str | Path,
    *,
    num_seeds: int = 5,
    overwrite: bool = False,
    workers: int = 2,
    progress: Callable[[str, int, int, float], None] | None = None,
    smoke: bool = False,
) -> tuple[list[dict[str, Any]], tuple[Path, ...]]:
    """Train every point (``workers`` at a time) into ``<out>/points/<id>/``, growing the
    rate grids of an :class:`AutoRates` experiment; return every run row (with
    ``flops_per_step``) and the point folders. ``progress(point, step, total, loss)`` follows
    each point. A point folder holding another run is a ``FileExistsError`` before anything
    trains (:func:`check_points`); a point folder of the same config resumes (a finished
    one is evaluated from its last checkpoint, not trained again)."""
    names = labels(experiment.points)
    folders, configs = check_points(experiment, out, num_seeds=num_seeds, overwrite=overwrite)

    def train_point(i: int, point: Mapping[str, Any]) -> list[dict[str, Any]]:
        return train_point_at(i, point, folders[i], experiment.rates(point))

    def train_point_at(
        i: int, point: Mapping[str, Any], folder: Path, rates: Sequence[float] | None
    ) -> list[dict[str, Any]]:
        name = names[i]
        return train_and_evaluate(
            configs[i],
            folder,
            num_seeds=num_seeds,
            learning_rates=rates,
            fields={"point": name, **point},
            overwrite=overwrite,
            progress=functools.partial(progress, name) if progress else None,
            smoke=smoke,
        )

    # Points compile and run in parallel threads: XLA compiles one program on one core.
    # Across processes every process must run the same programs in the same order: no threads.
    workers = 1 if jax.process_count() > 1 else workers
    with ThreadPoolExecutor(max_workers=workers) as pool:
        all_rows = list(pool.map(train_point, range(len(experiment.points)), experiment.points))
    rows = [r for point_rows in all_rows for r in point_rows]
    if isinstance(experiment.learning_rates, AutoRates):
        rows = _extend_rates(experiment, rows, folders, train_point_at, workers)
    return rows, folders


def _extend_rates(
    experiment: Experiment,
    rows: list[dict[str, Any]],
    folders: Sequence[Path],
    train_point_at: Callable[..., list[dict[str, Any]]],
    workers: int,
) -> list[dict[str, Any]]:
    """Grow each point's grid (:class:`AutoRates`): while some point's best rate is at an edge
    within the bounds, train that point at the next rate (``<folder>/lr=<rate>``, a run folder
    of its own) and add its rows. Return every row."""
    auto = experiment.learning_rates
    while True:
        summary, _ = summarize(experiment, rows)
        todo = []
        for i, (point, stats) in enumerate(summary):
            rates = [lr for lr, _, _ in stats.by_learning_rate]
            rate = auto.next_rate(rates, stats.learning_rate) if stats.at_edge else None
            if rate is not None:
                todo.append((i, point, folders[i] / f"lr={rate:g}", (rate,)))
        if not todo:
            return rows
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for new in pool.map(lambda job: train_point_at(*job), todo):
                rows = rows + new


def summarize(
    experiment: Experiment, rows: Sequence[Mapping[str, Any]]
) -> tuple[Summary, list[dict[str, Any]]]:
    """The :class:`Summary` of a sweep's run rows (every point, seed and learning rate, each
    naming its point by its label in ``point``) and the ``results.csv`` table they make: each
    point's overrides as the experiment declares them and ``chosen`` marking its best rate."""
    names = labels(experiment.points)
    by_name: dict[str, list[Mapping[str, Any]]] = {n: [] for n in names}
    for r in rows:
        if r["point"] not in by_name:
            raise ValueError(f"results.csv: rows of an unknown point {r['point']!r}")
        by_name[r["point"]].append(r)
    if missing := [n for n, group in by_name.items() if not group]:
        raise ValueError(f"results.csv: no rows for the points {missing}")
    entries, table = [], []
    for point, name in zip(experiment.points, names, strict=True):
        stats = point_stats(by_name[name], experiment)
        entries.append((point, stats))
        table += [
            {k: v for k, v in r.items() if k != "flops_per_step"}
            | dict(point)
            | {"chosen": r["learning_rate"] == stats.learning_rate}
            for r in by_name[name]
        ]
    return Summary(entries), _column_order(table)


def judge(experiment: Experiment, summary: Summary) -> tuple[str, str]:
    """``experiment.verdict(summary)``, checked to be one of :data:`VERDICTS`."""
    verdict, reason = experiment.verdict(summary)
    if verdict not in VERDICTS:
        raise ValueError(f"verdict: expected one of {VERDICTS}, got {verdict!r}")
    return verdict, reason


def check_points(
    experiment: Experiment, out: str | Path, *, num_seeds: int = 5, overwrite: bool = False
) -> tuple[tuple[Path, ...], list[ExperimentConfig]]:
    """Each point's run folder and config; a ``FileExistsError`` if a point's folder holds
    another run (``overwrite``: it is replaced), a ``ValueError`` for a bad point."""
    names = labels(experiment.points)
    folders = tuple(
        Path(out) / "points" / f"{i:02d}_{re.sub(r'[^A-Za-z0-9=.-]+', '_', name)}"
        for i, name in enumerate(names)
    )
    configs = [with_overrides(experiment.base, {**p, "name": n})
               for p, n in zip(experiment.points, names, strict=True)]  # fmt: skip
    for config, folder, point in zip(configs, folders, experiment.points, strict=True):
        check_workdir(
            config, folder, num_seeds=num_seeds, learning_rates=experiment.rates(point),
            overwrite=overwrite,
        )  # fmt: skip
    return folders, configs


def point_stats(rows: Sequence[Mapping[str, Any]], experiment: Experiment) -> Stats:
    """A point's :class:`Stats` from its run rows (every seed × learning rate)."""
    metric, sign = experiment.metric, 1 if experiment.higher_is_better else -1
    by_lr: dict[float, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_lr.setdefault(r["learning_rate"], []).append(r)

    def mean(lr: float, split: str) -> float:
        return sum(r[f"{split}_{metric}"] for r in by_lr[lr]) / len(by_lr[lr])

    def score(lr: float) -> float:  # NaN (diverged): worst
        value = mean(lr, "valid")
        return -math.inf if math.isnan(value) else sign * value

    best = max(by_lr, key=score)  # ties: the first rate
    values = tuple(r[f"test_{metric}"] for r in by_lr[best])
    return Stats(
        *report.mean_ci95(values),
        values,
        best,
        by_lr[best][0]["params"],
        tuple((lr, mean(lr, "valid"), mean(lr, "test")) for lr in sorted(by_lr)),
    )


def _column_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``point``, the overrides, ``seed``, ``learning_rate``, ``chosen``, ``params``, then the
    metrics (``valid_*``, then ``test_*``, then ``longer_*``)."""
    first = ["point", "seed", "learning_rate", "chosen", "params"]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    prefixes = report.SPLIT_PREFIXES
    overrides = [k for k in keys if k not in first and not k.startswith(prefixes)]
    metrics = sorted(
        (k for k in keys if k.startswith(prefixes)),
        key=lambda k: (prefixes.index(k.partition("_")[0] + "_"), k),
    )
    order = ["point", *overrides, *first[1:], *metrics]
    return [{k: r.get(k) for k in order} for r in rows]


def summary_table(summary: Summary, experiment: Experiment) -> str:
    threshold = experiment.solved_at
    header = ["point", "params", "lr", f"test {experiment.metric}", "seeds"]
    if threshold is not None:
        header.insert(4, f"solved (≥ {threshold:g})")
    rows = []
    for name, s in summary.labels().items():
        lr = f"{s.learning_rate:g}" + (" (edge)" if s.at_edge else "")
        row = [name, s.params, lr, report.fmt(s.mean, s.half_width), len(s.values)]
        if threshold is not None:
            row.insert(4, f"{s.solved(threshold)} of {len(s.values)}")
        rows.append(row)
    return report.markdown_table(header, rows)


def learning_rate_table(summary: Summary, metric: str) -> str:
    """Every point's mean valid / test metric at every learning rate of its grid."""
    rates = sorted({lr for _, s in summary for lr, _, _ in s.by_learning_rate})
    rows = []
    for name, s in summary.labels().items():
        cells = {lr: f"{v:.3f} / {t:.3f}" for lr, v, t in s.by_learning_rate}
        rows.append([name, *(cells.get(lr, "") for lr in rates)])
    header = ["point", *(f"lr {lr:g}" for lr in rates)]
    return f"Valid / test {metric} (mean over seeds) at every learning rate:\n\n" + (
        report.markdown_table(header, rows)
    )


def edge_points(summary: Summary) -> list[str]:
    """Labels of the points whose best learning rate is at the edge of their grid."""
    return [name for name, s in summary.labels().items() if s.at_edge]


def sweep_report(
    experiment: Experiment,
    summary: Summary,
    verdict: str,
    reason: str,
    num_seeds: int,
    record_seeds: Sequence[int] | None = None,
) -> str:
    """The report's section; ``record_seeds``: the seeds trained (default: :func:`seeds`), which
    a report names beside ``pilot_seeds`` when the experiment declares any."""
    if record_seeds is None:
        record_seeds = seeds(experiment, num_seeds) if experiment.pilot_seeds else ()
    return (
        f"# {experiment.name}\n\n**Claim ({experiment.claim_id}).** {experiment.claim}\n\n"
        f"{num_seeds} seeds per point, each evaluated on its own validation and test draws; "
        f"mean ± 95% interval (Student t). {sweep_tables(experiment, summary)}\n"
        f"![summary](summary.png)\n\n{declared_notes(experiment, record_seeds)}"
        f"**Verdict ({experiment.claim_id}): {verdict}.** {reason}\n"
    )


def sweep_tables(experiment: Experiment, summary: Summary) -> str:
    """The learning-rate note, the summary table, the edge flags and the metric against
    learning rate (markdown)."""
    lrs = experiment.learning_rates
    if isinstance(lrs, AutoRates):
        added = {n: lrs.added(lr for lr, _, _ in s.by_learning_rate)
                 for n, s in summary.labels().items()}  # fmt: skip
        lr_note = extension_note(lrs, added)
    elif callable(lrs):
        lr_note = "Each point at the best learning rate of its grid (chosen on the valid split)."
    elif lrs:
        lr_note = (
            f"Each point at its best learning rate of {list(lrs)} (chosen on the valid split)."
        )
    else:
        base = f"{experiment.base.optim.learning_rate:g}"
        own = sum("optim.learning_rate" in point for point in experiment.points)
        others = "" if own == len(experiment.points) else f"; {base} for the others"
        lr_note = (
            f"The learning rate each point sets (the lr column){others}."
            if own
            else f"Learning rate {base} for every point."
        )
    edges = edge_points(summary)
    edge_note = (
        f"\n**Best learning rate at the edge of the grid** ({len(edges)} of {len(summary)} "
        f"points, marked *(edge)*): a wider grid might change these points.\n"
        if edges
        else ""
    )
    lr_table = f"\n{learning_rate_table(summary, experiment.metric)}" if lrs else ""
    return f"{lr_note}\n\n{summary_table(summary, experiment)}{edge_note}{lr_table}"


def plot_summary(summary: Summary, experiment: Experiment, path: Path, smoke: bool = False) -> None:
    """One bar per point: mean metric with its 95% interval and the seeds as dots."""
    accuracy = experiment.metric == "accuracy"
    report.plot_summary(
        summary.labels(), path, metric=experiment.metric,
        title=f"{experiment.name} ({experiment.claim_id})",
        chance=experiment.base.task.spec.chance_accuracy if accuracy else None, smoke=smoke,
    )  # fmt: skip
