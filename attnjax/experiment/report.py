"""Tables, intervals, plots and verdict text for run folders and sweeps.

Plots use ``matplotlib.figure.Figure`` directly: no pyplot state, safe in threads, and the
user's backend is left alone.
"""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats


def mean_ci95(values: Sequence[float | np.floating]) -> tuple[float, float]:
    """Mean and half-width of its 95% Student-t interval (``nan`` width for one value)."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), math.nan
    t = stats.t.ppf(0.975, df=len(x) - 1)
    return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(len(x)))


def fmt(mean: float, half: float) -> str:
    return f"{mean:.3f}" if math.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run_report(config: Any, results: Sequence[dict[str, Any]]) -> str:
    """``report.md`` of one run folder: the final metrics, mean ± 95% interval over seeds,
    per learning rate."""
    metrics = [k for k in results[0] if k.startswith(("valid_", "test_"))]
    rows = []
    for lr in dict.fromkeys(r["learning_rate"] for r in results):
        group = [r for r in results if r["learning_rate"] == lr]
        rows.append([lr, len(group), *(fmt(*mean_ci95([r[m] for r in group])) for m in metrics)])
    table = markdown_table(["learning rate", "seeds", *metrics], rows)
    return f"# {config.name}\n\nFinal metrics, mean ± 95% interval over seeds.\n\n{table}"


def plot_curves(metrics: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Training loss and test metrics against step, one line per run."""
    names = ["loss", *sorted({m["metric"] for m in metrics if m["split"] == "test"} - {"loss"})]
    fig, axes = new_figure(1, len(names), squeeze=False, figsize=(4.2 * len(names), 3.4))
    for ax, name in zip(axes[0], names, strict=True):
        split = "train" if name == "loss" else "test"
        runs = sorted({(m["seed"], m["learning_rate"]) for m in metrics})
        for seed, lr in runs:
            pts = [
                (m["step"], m["value"])
                for m in metrics
                if (m["seed"], m["learning_rate"], m["split"], m["metric"])
                == (seed, lr, split, name)
            ]
            ax.plot(*zip(*pts, strict=True), label=f"seed {seed}, lr {lr:g}", lw=1)
        ax.set(xlabel="training step", ylabel=f"{split} {name}", title=f"{split} {name}")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, path, title)


def plot_attention(maps: Sequence[Any], path: Path, title: str) -> None:
    """Heatmaps of the first example's attention weights, one per layer and head
    (``maps``: per layer ``[B, N, T, S]``)."""
    heads = max(m.shape[1] for m in maps)
    fig, axes = new_figure(len(maps), heads, squeeze=False, figsize=(3.2 * heads, 2.8 * len(maps)))
    for layer, weights in enumerate(maps):
        for head in range(heads):
            ax = axes[layer, head]
            if head >= weights.shape[1]:
                ax.axis("off")
                continue
            image = ax.imshow(np.asarray(weights[0, head]), cmap="viridis", vmin=0, vmax=1)
            ax.set(xlabel="key position", title=f"layer {layer} head {head}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes[layer, 0].set_ylabel("query position")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)


def new_figure(
    *grid: int, figsize: tuple[int | float, int | float], **kwargs: Any
) -> tuple[Figure, Any]:
    """``(figure, axes)`` like ``plt.subplots(*grid, **kwargs)``, without pyplot's state."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def save_figure(fig: Figure, path: Path, title: str | None = None) -> None:
    """Lay ``fig`` out (under ``title``) and write it to ``path`` as a PNG."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
