"""Figures of inspection results: a :class:`~attnjax.inspect.Table` as a heatmap and a grid
of per-head attention patterns. Each function returns a ``matplotlib.figure.Figure`` (no
pyplot state, constrained layout); the caller saves it (``fig.savefig(path)``)."""

from collections.abc import Sequence

import numpy as np
from jaxtyping import ArrayLike, Float
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from attnjax.inspect.patching import PatchingTable, Table


def table_figure(table: Table, title: str | None = None) -> Figure:
    """A heatmap of ``table.values`` with its axes and labels, and a colour bar named after
    the table. A :class:`PatchingTable` uses a diverging map centred on 0."""
    rows, columns = table.labels
    fig = Figure(figsize=(max(3.5, 0.45 * len(columns) + 2.2), max(2.4, 0.4 * len(rows) + 1.4)),
                 layout="constrained")  # fmt: skip
    _heatmap(fig, fig.subplots(), table, title or table.name)
    return fig


def tables_figure(tables: Sequence[Table], title: str | None = None) -> Figure:
    """The heatmaps of :func:`table_figure` side by side, each titled with its table's name."""
    width = sum(max(3.5, 0.45 * len(t.labels[1]) + 2.2) for t in tables)
    height = max(max(2.4, 0.4 * len(t.labels[0]) + 1.4) for t in tables) + 0.4
    fig = Figure(figsize=(width, height), layout="constrained")
    for ax, table in zip(fig.subplots(1, len(tables), squeeze=False)[0], tables, strict=True):
        _heatmap(fig, ax, table, table.name)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _heatmap(fig: Figure, ax, table: Table, title: str) -> None:
    values = np.asarray(table.values, float)
    rows, columns = table.labels
    if isinstance(table, PatchingTable):
        bound = max(float(np.nanmax(np.abs(values), initial=0.0)), 1.0)
        image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel(table.axes[1])
    ax.set_ylabel(table.axes[0])
    ax.set_title(title, fontsize=10, wrap=True)
    fig.colorbar(image, ax=ax, label=table.name.rpartition(": ")[2])


def pattern_grid(
    patterns: Float[ArrayLike, "L N T S"],
    tokens: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """One heatmap per (layer, head) of one example's attention patterns (``patterns [L, N,
    T, S]``, e.g. ``cache.stack("attention.pattern")[:, 0]``), rows: layers, columns: heads;
    ``tokens``: labels of the positions (short strings), else their indices."""
    weights = np.asarray(patterns, float)
    layers, heads, length, keys = weights.shape
    fig = Figure(figsize=(max(2.6 * heads + 1.4, 4.5), 2.6 * layers + 0.6), layout="constrained")
    axes = fig.subplots(layers, heads, squeeze=False)
    for (layer, head), ax in np.ndenumerate(axes):
        image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"layer {layer} head {head}", fontsize=8)
        if tokens is None:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
        else:
            ax.set_xticks(range(keys), tokens[:keys], fontsize=6, rotation=90)
            ax.set_yticks(range(length), tokens[:length], fontsize=6)
        ax.tick_params(labelsize=6, labelleft=head == 0, labelbottom=layer == layers - 1)
    for ax in axes[:, 0]:
        ax.set_ylabel("query", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("key", fontsize=8)
    fig.colorbar(image, ax=axes, label="attention weight", shrink=min(1.0, 0.5 + 0.25 * layers))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
