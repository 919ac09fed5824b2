"""The expressiveness atlas: every score on every task column, at each head and layer count,
at matched parameter counts; its cells, heatmaps and MAD-style scores.

A :class:`Column` is one task at one difficulty level with its base config. A *cell* is
``(score, heads, layers)`` on a column: a sweep point whose width is the largest that keeps
the model's parameters within the scaled-dot model's at the column's width
(:func:`matched_width`), so a score's extra parameters never buy capacity. Each column trains
as a sweep of its cells (:func:`column_experiment`, every seed and rate vectorized) in its own
folder, so an atlas invoked again resumes where it stopped; a column's table may hold some of
its cells only, and a later call trains the rest (:func:`train_columns`).
"""

import contextlib
import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from attnjax import nn
from attnjax.experiment import record, report, storage, trainer
from attnjax.experiment.config import ExperimentConfig, with_overrides
from attnjax.experiment.sweep import (
    Experiment,
    LearningRates,
    Stats,
    check_points,
    labels,
    summarize,
    train_points,
)

WIDTH_STEP = 4  # default: multiples of 4, two heads of even size (RoPE rotates pairs)
TOLERANCE = 0.01  # a cell may exceed the scaled-dot budget by this share (cosine's scales)


class Column(NamedTuple):
    """One task at one difficulty level: ``name`` (``"in_context_recall-hard"``), ``family``
    (e.g. ``"mad"``), the ``base`` config its cells override and ``solved_at``, the test
    accuracy a seed must reach to count as solved; its cells' widths are multiples of
    ``width_step``. ``extrapolates``: the base trains with an extrapolation split
    (``train.extrapolate`` > 1)."""

    name: str
    family: str
    base: ExperimentConfig
    solved_at: float = 0.9
    width_step: int = WIDTH_STEP

    @property
    def extrapolates(self) -> bool:
        return self.base.train.extrapolate > 1


class Cell(NamedTuple):
    """A cell's outcome: test accuracy over seeds at its best rate (:class:`Stats`, values in
    the order of their seeds), the extrapolation split's mean accuracy at that rate (NaN
    without one), the training FLOPs of one run (``flops_per_step × steps``) and its width."""

    stats: Stats
    longer: float
    train_flops: float
    width: int

    def seeds_at(self, bar: float) -> str:
        """``"k/n"``: the seeds of ``n`` whose test accuracy reaches ``bar``."""
        return f"{self.stats.solved(bar)}/{len(self.stats.values)}"


def param_count(config: ExperimentConfig) -> int:
    """Parameters of ``config``'s model (shapes only, nothing is initialized)."""
    return _model_param_count(config.model, nn.MODELS.get(config.model.kind))


@functools.cache
def _model_param_count(model: nn.ModelConfig, kind: type | None) -> int:
    """Parameters of the model ``model`` configures, counted once per model (columns share
    models); ``kind``, the class registered for its kind, keys it too (registered anew, the
    kind is counted anew)."""
    return trainer.param_count(lambda: nn.build(model, nnx.Rngs(0)))


@functools.cache
def matched_width(
    base: ExperimentConfig, score: str, heads: int, layers: int, step: int = WIDTH_STEP
) -> int:
    """The largest multiple of ``step`` up to ``base.model.width`` at which the model with
    ``score``, ``heads`` and ``layers`` has at most the parameters of the scaled-dot model at
    ``base.model.width`` (plus :data:`TOLERANCE`); a ``ValueError`` if none has."""
    shape = {"model.heads": heads, "model.layers": layers}
    budget = param_count(with_overrides(base, shape | {"model.score": "scaled_dot"}))
    for width in range(base.model.width - base.model.width % step, 0, -step):
        config = with_overrides(base, shape | {"model.score": score, "model.width": width})
        if param_count(config) <= budget * (1 + TOLERANCE):
            return width
    raise ValueError(f"matched_width: no width fits {score} within {budget} parameters")


def _judged_by_the_atlas(summary: Any) -> tuple[str, str]:
    raise ValueError("a column's sweep judges nothing: the atlas judges its claims over columns")


def column_experiment(
    column: Column,
    scores: Sequence[str],
    heads: Sequence[int],
    layers: Sequence[int],
    learning_rates: LearningRates | str,
) -> Experiment:
    """The sweep of ``column``'s cells: one point per score × heads × layers, at its
    :func:`matched_width`."""
    cells = [(s, h, n) for s in scores for h in heads for n in layers]
    return cell_experiment(column, cells, learning_rates)


def cell_experiment(
    column: Column,
    cells: Sequence[tuple[str, int, int]],
    learning_rates: LearningRates | str,
    matched: bool = True,
) -> Experiment:
    """The sweep of ``column``'s ``cells``, ``(score, heads, layers)`` each, at its
    :func:`matched_width` (``matched=False``: at the column's width)."""
    points = tuple(
        {"model.score": s, "model.heads": h, "model.layers": n,
         "model.width": matched_width(column.base, s, h, n, column.width_step) if matched
                        else column.base.model.width}
        for s, h, n in cells
    )  # fmt: skip
    return Experiment(
        name=column.name,
        claim_id="atlas",
        claim=f"a column of the atlas: {column.name}",
        base=column.base,
        points=points,
        metric="accuracy",
        verdict=_judged_by_the_atlas,
        learning_rates=learning_rates,
        solved_at=column.solved_at,
    )


def train_columns(
    experiments: Sequence[Experiment],
    out: Path,
    *,
    num_seeds: int,
    overwrite: bool = False,
    progress: Callable[[str, int, int, float], None] | None = None,
    finished: Path | None = None,
) -> list[dict[str, Any]]:
    """Train each column's sweep in ``<out>/columns/<name>/`` (resuming what its folders
    hold) and write its table, ``<out>/columns/<name>.csv``, with its plan beside it
    (``<name>.json``: base config, cells, seeds, rates); return the run rows of every cell
    asked for, ``column`` first, with ``train_flops``. A column's table in ``<out>/columns/``,
    or else in ``finished`` (the tables of a partly finished atlas, committed to resume it on
    another machine), is read, not trained. A table may hold some of the column's cells only
    (trained with a subset of the scores): then only the cells it lacks train, and the table
    written holds both, so a column too long for one machine's session trains in parts (the
    cells a call trains are numbered among themselves in their folders' names: the same call
    again resumes them, a call for other cells trains in folders of its own). A
    table whose plan is not the column's but for its cells is a ``ValueError``
    (``overwrite``: trained again). Each row carries the cost of the call that trained its
    cell (:func:`timed`) and ``resumed``: 1 if that call found training from an earlier call
    in its cells' folders, whose time is not counted."""
    rows = []
    for experiment in experiments:
        folder = out / "columns" / experiment.name
        have, found = ([], []) if overwrite else _finished(experiment, num_seeds, out, finished)
        asked = labels(experiment.points)
        todo = [p for p in experiment.points if _cell_plan(p) not in have]
        if todo:
            part = dataclasses.replace(experiment, points=tuple(todo))
            found += _train_part(part, folder, num_seeds, overwrite, progress)
            plan = _plan(experiment, num_seeds) | {"cells": have + [_cell_plan(p) for p in todo]}
            storage.write_csv(folder.with_suffix(".csv"), found)
            storage.write_json(folder.with_suffix(".json"), plan)
        rows += [r for r in found if r["point"] in asked]
    return rows


def _train_part(
    part: Experiment,
    folder: Path,
    num_seeds: int,
    overwrite: bool,
    progress: Callable[[str, int, int, float], None] | None,
) -> list[dict[str, Any]]:
    """Train the cells of ``part`` (a column's sweep, some of its cells) in ``folder``; their
    run rows with the call's cost."""
    named = None if progress is None else functools.partial(_named, progress, part.name)
    points, _ = check_points(part, folder, num_seeds=num_seeds, overwrite=overwrite)
    resumed = not overwrite and any(any(p.rglob("metrics.jsonl")) for p in points)
    with timed() as cost:
        found, _ = train_points(
            part, folder, num_seeds=num_seeds, overwrite=overwrite, progress=named
        )
    steps = part.base.train.steps
    return [{"column": part.name, **r, "train_flops": r["flops_per_step"] * steps}
            | cost | {"resumed": int(resumed)} for r in found]  # fmt: skip


def _finished(
    experiment: Experiment, num_seeds: int, out: Path, finished: Path | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cells (as the plan writes them) and the rows of the column's table in
    ``<out>/columns/``, or else in ``finished`` (none: two empty lists); a ``ValueError`` if its
    plan is not the column's but for its cells, or if it holds one of the cells asked for with
    another width."""
    plan = _plan(experiment, num_seeds)
    asked = {_cell_key(c): c for c in plan["cells"]}
    for table in (out / "columns" / f"{experiment.name}.csv",
                  finished and finished / f"{experiment.name}.csv"):  # fmt: skip
        if table is None or not table.is_file():
            continue
        plan_file = table.with_suffix(".json")
        found = storage.read_json(plan_file) if plan_file.is_file() else {}
        cells = found.pop("cells", None)
        if (
            cells is None
            or found != {k: v for k, v in plan.items() if k != "cells"}
            or any(asked.get(_cell_key(c), c) != c for c in cells)
        ):
            raise ValueError(
                f"{table}: written for another plan than {experiment.name}'s (config, cells, "
                f"seeds or rates; see {plan_file.name}): remove it, or overwrite"
            )
        return cells, record.read_rows(table)
    return [], []


def _cell_plan(point: Mapping[str, Any]) -> dict[str, Any]:
    """A cell as its column's plan writes it (JSON read back)."""
    return json.loads(json.dumps(dict(point)))


def _cell_key(cell: Mapping[str, Any]) -> tuple[str, int, int]:
    """A cell's score, heads and layers (its width follows from them)."""
    return cell["model.score"], cell["model.heads"], cell["model.layers"]


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """The cost of the block, filled in on exit: ``wall_s``, the process's CPU seconds
    (``cpu_s``, every thread) and ``compile_s``, the wall seconds during which JAX was tracing,
    lowering or compiling in some thread (the union of its compile events' intervals, from
    :mod:`jax.monitoring`; at most ``wall_s``)."""
    cost, spans = {}, []

    def listener(event: str, seconds: float, **_: Any) -> None:
        if event.startswith("/jax/core/compile/"):
            end = time.monotonic()
            spans.append((end - seconds, end))

    wall, cpu = time.monotonic(), time.process_time()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield cost
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        cost |= {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu,
                 "compile_s": _union(spans)}  # fmt: skip


def _union(spans: Sequence[tuple[float, float]]) -> float:
    """The total length covered by the intervals ``spans``."""
    total, reached = 0.0, -math.inf
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def _plan(experiment: Experiment, num_seeds: int) -> dict[str, Any]:
    """What a column's table must have been trained with, as JSON reads it back."""
    start = experiment.base.train.seed
    rates = experiment.learning_rates
    plan = {
        "base": experiment.base.to_dict(),
        "cells": [_cell_plan(p) for p in experiment.points],
        "seeds": list(range(start, start + num_seeds)),
        "rates": repr(rates),
    }
    return json.loads(json.dumps(plan))


def _named(progress: Callable[[str, int, int, float], None], column: str, point: str, *args):
    progress(f"{column}: {point}", *args)


def cells(
    experiments: Sequence[Experiment], rows: Sequence[Mapping[str, Any]]
) -> dict[tuple[str, str, int, int], Cell]:
    """Every cell present in ``rows``, by ``(column, score, heads, layers)``: its test accuracy
    at the rate chosen on the valid split (:func:`attnjax.experiment.sweep.summarize`), the
    extrapolation split and the training FLOPs at that rate. A column without rows is left
    out; a column with some of its cells only is a ``ValueError`` (from ``summarize``). Each
    cell's values are in the order of their seeds, so cells of a column pair by seed."""
    found = {}
    for experiment in experiments:
        own = sorted((r for r in rows if r["column"] == experiment.name), key=lambda r: r["seed"])
        if not own:
            continue
        summary, _ = summarize(experiment, own)
        for point, name in zip(experiment.points, labels(experiment.points), strict=True):
            stats = summary[point]
            rate = stats.learning_rate
            chosen = [r for r in own if r["point"] == name and r["learning_rate"] == rate]
            longer = [_or_nan(r.get("longer_accuracy")) for r in chosen]
            key = (experiment.name, point["model.score"], point["model.heads"],
                   point["model.layers"])  # fmt: skip
            flops = float(chosen[0]["train_flops"])
            found[key] = Cell(stats, float(np.mean(longer)), flops, point["model.width"])
    return found


def _or_nan(value: float | None) -> float:
    """A table's cell, NaN where the column has none (a column without the split)."""
    return math.nan if value is None else value


def heatmap_figure(
    found: Mapping[tuple[str, str, int, int], Cell],
    columns: Sequence[Column],
    scores: Sequence[str],
    settings: Sequence[tuple[int, int]],
) -> plt.Figure:
    """One heatmap per ``(heads, layers)`` setting: scores × columns, each cell its mean test
    accuracy with its solved seeds (``k/n``); a cell not trained is blank. Untitled: the
    caller's :func:`attnjax.experiment.report.save_figure` names it."""
    width, height = max(6.0, 2.0 + 0.7 * len(columns)), 2.2 + 0.35 * len(scores)
    fig, axes = plt.subplots(len(settings), 1, figsize=(width, height * len(settings)),
                             squeeze=False)  # fmt: skip
    for ax, (heads, layers) in zip(axes[:, 0], settings, strict=True):
        values = np.full((len(scores), len(columns)), np.nan)
        for i, score in enumerate(scores):
            for j, column in enumerate(columns):
                cell = found.get((column.name, score, heads, layers))
                if cell is None:
                    continue
                values[i, j] = cell.stats.mean
                color = "white" if cell.stats.mean < 0.6 else "black"
                text = f"{cell.stats.mean:.2f}\n{cell.seeds_at(column.solved_at)}"
                ax.text(j, i, text, ha="center", va="center", fontsize=6, color=color)
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_yticks(range(len(scores)), scores, fontsize=7)
        ax.set_xticks(range(len(columns)), [c.name for c in columns], rotation=60, ha="right",
                      fontsize=7)  # fmt: skip
        ax.set_title(f"{heads} head{'s' * (heads > 1)}, {layers} layer{'s' * (layers > 1)}",
                     fontsize=8)  # fmt: skip
        fig.colorbar(image, ax=ax, shrink=0.9, pad=0.01)
    return fig


def family_scores(
    found: Mapping[tuple[str, str, int, int], Cell],
    columns: Sequence[Column],
    score: str,
    setting: tuple[int, int],
    longer: bool = False,
) -> float:
    """MAD's score: the mean test accuracy of ``score`` at ``setting`` over ``columns`` (every
    task and difficulty level of a family); ``longer``: of the extrapolation split, over the
    columns that have one. NaN if a cell is missing."""
    chosen = [c for c in columns if c.extrapolates or not longer]
    values = []
    for column in chosen:
        cell = found.get((column.name, score, *setting))
        if cell is None:
            return math.nan
        values.append(cell.longer if longer else cell.stats.mean)
    return float(np.mean(values)) if values else math.nan


def cell_table(
    found: Mapping[tuple[str, str, int, int], Cell],
    columns: Sequence[Column],
    scores: Sequence[str],
    setting: tuple[int, int],
) -> str:
    """The markdown table of one ``(heads, layers)`` setting: a row per column, a cell per
    score (mean ± 95% interval, solved seeds)."""
    rows = []
    for column in columns:
        row = [column.name]
        for score in scores:
            cell = found.get((column.name, score, *setting))
            row.append("–" if cell is None else (
                f"{report.fmt(cell.stats.mean, cell.stats.half_width)} "
                f"({cell.seeds_at(column.solved_at)})"))  # fmt: skip
        rows.append(row)
    return report.markdown_table(["column", *scores], rows)
