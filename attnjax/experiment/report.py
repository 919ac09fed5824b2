"""Tables, intervals, plots and verdict text for run folders and sweeps.

Plots use ``matplotlib.figure.Figure`` directly: no pyplot state, safe in threads, and the
user's backend is left alone. Figures use constrained layout, so titles, labels and colour bars
stay on the canvas; legends sit outside the axes. A smoke run's report and figures say so in
their titles (``smoke=True``).
"""

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from scipy import stats

from attnjax.inspect.figures import pattern_grid


def mean_ci95(values: Sequence[float | np.floating]) -> tuple[float, float]:
    """Mean and half-width of its 95% Student-t interval (``nan`` width for one value)."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), float(_t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


@functools.cache
def _t975(df: int) -> float:
    """Student t's 97.5% quantile (cached: audits call it thousands of times)."""
    return float(stats.t.ppf(0.975, df=df))


# The evaluation splits' metric columns of results.csv, in the order tables show them
# (``longer_*`` only with ``train.extrapolate > 1``).
SPLIT_PREFIXES = ("valid_", "test_", "longer_")
# The range a metric cannot leave: its error bars are clipped to it.
METRIC_RANGES = {"accuracy": (0.0, 1.0)}
SMOKE_NOTE = (
    "**Smoke run**: a few steps to check that everything runs; its numbers are not results.\n\n"
)


_SMOKE = contextvars.ContextVar("smoke_figures", default=False)


@contextlib.contextmanager
def smoke_figures(smoke: bool = True) -> Iterator[None]:
    """Within it, every figure :func:`save_figure` writes (in this thread) is marked as a smoke
    run's: for code that draws its own figures, such as an experiment's ``analyze``."""
    token = _SMOKE.set(smoke)
    try:
        yield
    finally:
        _SMOKE.reset(token)


def smoke_title(title: str | None, smoke: bool) -> str | None:
    """``title``, marked as a smoke run's when ``smoke``."""
    if not smoke:
        return title
    return f"{title} (smoke)" if title else "smoke run"


def fmt(mean: float, half: float) -> str:
    return f"{mean:.3f}" if math.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run_report(config: Any, results: Sequence[dict[str, Any]], smoke: bool = False) -> str:
    """``report.md`` of one run folder: the final metrics, mean ± 95% interval over seeds,
    one row per metric and one column per learning rate, so a task with many metrics stays
    narrow (``smoke``: titled and noted as a smoke run)."""
    metrics = [k for k in results[0] if k.startswith(SPLIT_PREFIXES)]
    rates = dict.fromkeys(r["learning_rate"] for r in results)
    groups = {lr: [r for r in results if r["learning_rate"] == lr] for lr in rates}
    rows = [["seeds", *(len(g) for g in groups.values())]]
    rows += [[m, *(fmt(*mean_ci95([r[m] for r in g])) for g in groups.values())] for m in metrics]
    table = markdown_table(["metric", *(f"lr {lr:g}" for lr in rates)], rows)
    note = SMOKE_NOTE if smoke else ""
    return (
        f"# {smoke_title(config.name, smoke)}\n\n{note}"
        f"Final metrics, mean ± 95% interval over seeds.\n\n{table}"
    )


# Line styles told apart at a glance; with more seeds than these, every seed is drawn solid.
SEED_STYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)),
               (0, (5, 5)), (0, (3, 5, 1, 5)), (0, (8, 2, 2, 2)))  # fmt: skip


def plot_curves(
    metrics: Sequence[dict[str, Any]], path: Path, title: str, smoke: bool = False
) -> Figure:
    """Training loss and test metrics against step, one line per run: one colour per learning
    rate, one line style per seed; the legend outside the axes. A run with a ``longer`` split
    (``train.extrapolate > 1``) gets a second row: that split's loss and metrics."""
    names = sorted({m["metric"] for m in metrics if m["split"] == "test"} - {"loss"})
    panels = [[("train", "loss"), *(("test", n) for n in names)]]
    if any(m["split"] == "longer" for m in metrics):
        panels.append([("longer", n) for n in ("loss", *names)])
    rates = sorted({m["learning_rate"] for m in metrics})
    seeds = sorted({m["seed"] for m in metrics})
    colour = dict(zip(rates, distinct_colours(len(rates)), strict=True))
    styles = SEED_STYLES if len(seeds) <= len(SEED_STYLES) else ("-",) * len(seeds)
    style = dict(zip(seeds, styles, strict=False))
    size = (3.6 * len(panels[0]) + 1.6, 3.4 * len(panels))
    fig, axes = new_figure(len(panels), len(panels[0]), squeeze=False, figsize=size)
    for ax, (split, name) in zip(axes.flat, (p for row in panels for p in row), strict=True):
        for seed in seeds:
            for lr in rates:
                pts = [
                    (m["step"], m["value"])
                    for m in metrics
                    if (m["seed"], m["learning_rate"], m["split"], m["metric"])
                    == (seed, lr, split, name)
                ]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=colour[lr], ls=style[seed], lw=1)
        ax.set(xlabel="training step", ylabel=f"{split} {name}", title=f"{split} {name}")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colour[lr], label=f"lr {lr:g}") for lr in rates]
    if len(seeds) <= len(SEED_STYLES):
        handles += [Line2D([], [], color="k", ls=style[s], label=f"seed {s}") for s in seeds]
    else:
        handles.append(Line2D([], [], color="k", label=f"{len(seeds)} seeds, one line each"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=7, handlelength=3.5)
    save_figure(fig, path, title, smoke)
    return fig


def distinct_colours(n: int) -> list[Any]:
    """``n`` colours, none repeated: matplotlib's ten for ``n <= 10``, else a colour map."""
    if n <= 10:
        return list(colormaps["tab10"].colors[:n])
    return list(colormaps["viridis"](np.linspace(0, 0.95, n)))


def plot_attention(maps: Sequence[Any], path: Path, title: str, smoke: bool = False) -> Figure:
    """Heatmaps of the first example's attention weights, one per layer and head (``maps``:
    per layer ``[B, N, T, S]``; :func:`attnjax.inspect.pattern_grid`)."""
    fig = pattern_grid(np.stack([np.asarray(weights[0]) for weights in maps]))
    save_figure(fig, path, title, smoke)
    return fig


def plot_summary(
    points: Mapping[str, Any],
    path: Path,
    *,
    metric: str,
    title: str,
    chance: float | None = None,
    smoke: bool = False,
) -> Figure:
    """One bar per point (``points``: name → an object with ``mean``, ``half_width`` and the
    seeds' ``values``): the mean test metric with its 95% interval, clipped to the metric's
    range (:data:`METRIC_RANGES`; the label says so when it clips), and the seeds as dots."""
    names = list(points)
    lo, hi = METRIC_RANGES.get(metric, (-math.inf, math.inf))
    means = np.array([points[n].mean for n in names], float)
    half = np.nan_to_num(np.array([points[n].half_width for n in names], float))
    lower, upper = np.maximum(means - half, lo), np.minimum(means + half, hi)
    clipped = bool(np.any(lower > means - half) or np.any(upper < means + half))
    fig, ax = new_figure(figsize=(7, 0.35 * len(names) + 1.4))
    errors = np.stack([means - lower, upper - means])
    ax.barh(range(len(names)), means, xerr=errors, color="#8fb3d9", capsize=3)
    for i, n in enumerate(names):
        ax.plot(points[n].values, [i] * len(points[n].values), "k.", ms=3)
    if chance is not None:
        ax.axvline(chance, color="grey", ls="--", lw=1, label=f"chance {chance:.3g}")
        fig.legend(loc="outside lower right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    clip_note = f", clipped to [{lo:g}, {hi:g}]" if clipped else ""
    ax.set_xlabel(f"test {metric} (mean ± 95% interval{clip_note}; dots: seeds)", wrap=True)
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path, title, smoke)
    return fig


def new_figure(
    *grid: int, figsize: tuple[int | float, int | float], **kwargs: Any
) -> tuple[Figure, Any]:
    """``(figure, axes)`` like ``plt.subplots(*grid, **kwargs)``, without pyplot's state, with
    constrained layout."""
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(*grid, **kwargs)


def save_figure(fig: Figure, path: Path, title: str | None = None, smoke: bool = False) -> None:
    """Write ``fig`` to ``path`` as a PNG under ``title`` (wrapped to the figure's width;
    ``smoke``, or within :func:`smoke_figures`: marked as a smoke run's), laid out so that no
    text leaves the canvas."""
    title = smoke_title(title, smoke or _SMOKE.get())
    if title:
        fig.suptitle(title, wrap=True)
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    fig.savefig(path, dpi=100)
