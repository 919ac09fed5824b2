"""Figures and report.md of run folders and sweeps: every text on the canvas, no two texts on
top of each other, legends off the curves, error bars inside the metric's range, smoke runs
labelled."""

import itertools
import types

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer
from matplotlib.text import Text

from attnjax.experiment import report

TITLE = "positional_amplitude: run 0 (seed 0, lr 0.003)"


def texts(fig):
    """``(text, window extent)`` of every text drawn (visible, non-empty, tick labels within
    their axis' view), rendered as saved."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    drawn = {}  # tick labels: only those of ticks inside the view are drawn
    for axis in (a for ax in fig.axes for a in (ax.xaxis, ax.yaxis)):
        lo, hi = sorted(axis.get_view_interval())
        margin = 1e-9 * (hi - lo)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            inside = tick.get_loc() is not None and lo - margin <= tick.get_loc() <= hi + margin
            drawn |= {id(tick.label1): inside, id(tick.label2): inside}
    found = fig.findobj(
        lambda a: isinstance(a, Text) and a.get_visible() and a.get_text() and drawn.get(id(a), 1)
    )
    return [(t.get_text(), t.get_window_extent(renderer)) for t in found]


def assert_laid_out(fig):
    """No text leaves the canvas, and no two texts overlap."""
    placed = texts(fig)
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in placed:
        inside = box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= width + 0.5
        assert inside and box.y1 <= height + 0.5, f"{text!r} leaves the canvas: {box.bounds}"
    for (a, box_a), (b, box_b) in itertools.combinations(placed, 2):
        assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"


def curve_metrics(rates, seeds):
    rows = []
    for lr, seed, step in itertools.product(rates, seeds, (10, 20)):
        base = {"step": step, "seed": seed, "learning_rate": lr}
        rows.append(base | {"split": "train", "metric": "loss", "value": 1 / step + lr})
        rows.append(base | {"split": "test", "metric": "accuracy", "value": 0.5 + lr})
    return rows


@pytest.mark.parametrize("layers, heads", [(1, 1), (3, 2), (2, 4)])
def test_attention_heatmaps_keep_titles_and_colour_bar_on_the_canvas(tmp_path, layers, heads):
    weights = np.full((1, heads, 8, 8), 1 / 8)
    fig = report.plot_attention([weights] * layers, tmp_path / "attention.png", TITLE)
    assert (tmp_path / "attention.png").exists()
    assert_laid_out(fig)
    assert any(text == "attention weight" for text, _ in texts(fig))


@pytest.mark.parametrize("rates, seeds", [([1e-3, 3e-3], [0, 1, 2]), (range(12), range(12))])
def test_curves_legend_sits_outside_the_axes_colour_per_rate(tmp_path, rates, seeds):
    rates = [0.001 * (r + 1) for r in rates]
    fig = report.plot_curves(curve_metrics(rates, list(seeds)), tmp_path / "c.png", TITLE)
    assert_laid_out(fig)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    (legend,) = fig.legends
    for ax in fig.axes:
        assert not legend.get_window_extent().overlaps(ax.get_window_extent())
        colours = {to_hex(line.get_color()) for line in ax.get_lines()}
        assert len(colours) == len(rates)  # one colour per rate, never repeated
    entries = [t.get_text() for t in legend.get_texts()]
    assert [e for e in entries if e.startswith("lr ")] == [f"lr {lr:g}" for lr in rates]


def stats(mean, half_width, values):
    return types.SimpleNamespace(mean=mean, half_width=half_width, values=values)


def test_summary_error_bars_stay_in_the_metric_range_and_say_so(tmp_path):
    points = {"heads=4 diversity=orthogonality diversity_weight=1.0": stats(0.98, 0.05, [1.0]),
              "two heads": stats(0.5, 0.1, [0.45, 0.55]),
              "one seed": stats(0.02, float("nan"), [0.02])}  # fmt: skip
    fig = report.plot_summary(
        points, tmp_path / "summary.png", metric="accuracy", title="xor_bits (E2)", chance=0.5
    )
    assert_laid_out(fig)
    (ax,) = fig.axes
    (errorbar,) = (c for c in ax.containers if isinstance(c, ErrorbarContainer))
    bars = errorbar.lines[2][0].get_segments()
    ends = np.array([[seg[0][0], seg[1][0]] for seg in bars])
    np.testing.assert_allclose(ends, [[0.93, 1.0], [0.4, 0.6], [0.02, 0.02]])
    assert "clipped to [0, 1]" in ax.get_xlabel()
    unclipped = {"two heads": points["two heads"]}
    fig = report.plot_summary(unclipped, tmp_path / "s.png", metric="accuracy", title="x")
    assert "clipped" not in fig.axes[0].get_xlabel()


def test_smoke_runs_say_smoke_in_every_title(tmp_path):
    metrics = curve_metrics([1e-3], [0])
    weights = [np.full((1, 1, 4, 4), 0.25)]
    points = {"p": stats(0.5, 0.1, [0.5])}
    for smoke in (False, True):
        figures = [
            report.plot_curves(metrics, tmp_path / "c.png", "xor", smoke=smoke),
            report.plot_attention(weights, tmp_path / "a.png", "xor", smoke=smoke),
            report.plot_summary(points, tmp_path / "s.png", metric="loss", title="x", smoke=smoke),
        ]
        for fig in figures:
            assert ("smoke" in fig.get_suptitle()) == smoke
            assert_laid_out(fig)
    results = [{"learning_rate": 1e-3, "seed": 0, "test_accuracy": 0.5}]
    config = types.SimpleNamespace(name="xor_relation")
    assert report.run_report(config, results).startswith("# xor_relation\n")
    smoke_report = report.run_report(config, results, smoke=True)
    assert smoke_report.startswith("# xor_relation (smoke)\n") and "Smoke run" in smoke_report
    assert report.smoke_title(None, True) == "smoke run"


def test_figures_drawn_within_smoke_figures_are_marked(tmp_path):
    """An experiment's own figures (``analyze``) are marked when the caller says smoke."""
    for smoke, title in ((True, "smoke run"), (False, "")):
        fig, ax = report.new_figure(figsize=(3, 2))
        ax.plot([0, 1])
        with report.smoke_figures(smoke):
            report.save_figure(fig, tmp_path / "analysis.png")
        assert fig.get_suptitle() == title
    fig, _ = report.new_figure(figsize=(3, 2))
    report.save_figure(fig, tmp_path / "after.png", "after")
    assert fig.get_suptitle() == "after"


def test_run_report_is_one_row_per_metric_and_one_column_per_rate():
    """A task with many metrics (qk_norm's 16) gave a table 18 columns wide."""
    metrics = {f"{split}_m{i}": 0.5 for split in ("valid", "test") for i in range(8)}
    results = [{"learning_rate": lr, "seed": s, **metrics} for lr in (1e-3, 3e-3) for s in (0, 1)]
    table = report.run_report(types.SimpleNamespace(name="qk_norm"), results)
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert lines[0] == "| metric | lr 0.001 | lr 0.003 |"
    assert lines[2] == "| seeds | 2 | 2 |" and len(lines) == 2 + 1 + 16
    assert all(line.count("|") == 4 for line in lines)
