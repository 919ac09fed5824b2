import dataclasses
import math

import numpy as np
import pytest

from attnjax.experiment import Experiment, Stats, Summary, grid, label, sweep
from attnjax.experiment.report import mean_ci95
from attnjax.experiment.storage import read_csv
from attnjax.experiment.sweep import labels, point_stats, sweep_tables


def test_grid_is_a_cartesian_product_with_tied_fields():
    points = grid(**{"model.score+model.heads": [("dot", 1), ("additive", 2)], "t.e": ["x"]})
    assert points == (
        {"model.score": "dot", "model.heads": 1, "t.e": "x"},
        {"model.score": "additive", "model.heads": 2, "t.e": "x"},
    )
    assert grid(**{"a.b": [1, 2], "c.d": ["x", "y", "z"]})[-1] == {"a.b": 2, "c.d": "z"}
    assert label({"model.score": "dot", "model.heads": 2}) == "score=dot heads=2"


def test_labels_fall_back_to_full_names_when_short_ones_collide():
    assert labels([{"model.heads": 1}, {"model.heads": 2}]) == ["heads=1", "heads=2"]
    assert labels([{"task.seed": 0, "train.seed": 1}, {"task.seed": 1, "train.seed": 0}]) == [
        "task.seed=0 train.seed=1",
        "task.seed=1 train.seed=0",
    ]


def test_summary_is_looked_up_by_full_overrides_in_any_order():
    a, b = (Stats(v, math.nan, (v,), 1e-3, 1) for v in (0.1, 0.9))
    summary = Summary(
        [({"task.seed": 0, "train.seed": 1}, a), ({"task.seed": 1, "train.seed": 0}, b)]
    )
    assert summary[{"train.seed": 1, "task.seed": 0}] is a
    assert summary[{"task.seed": 1, "train.seed": 0}] is b
    with pytest.raises(KeyError, match="no point"):
        summary[{"task.seed": 0}]
    with pytest.raises(ValueError, match="same overrides"):
        Summary([({"a.b": 1}, a), ({"a.b": 1}, b)])


def test_t_interval_and_solved_counts():
    values = [0.0, 1.0] * 6  # 12 values, df = 11: t = 2.201, not 1.96 or 2.042
    _, half = mean_ci95(values)
    assert math.isclose(half, 2.200985 * np.std(values, ddof=1) / math.sqrt(12), rel_tol=1e-5)
    stats = Stats(0.6, 0.1, (1.0, 1.0, 0.2, 0.2, 0.6), 1e-3, 1)
    assert stats.solved(0.9) == 2 and stats.solved(0.2) == 5


def test_best_rate_at_the_grid_edge_is_flagged(smoke_config):
    experiment = Experiment("e", "X1", "c", smoke_config, ({},), "accuracy", lambda s: ("", ""))
    rows = [{"learning_rate": lr, "seed": s, "params": 3, "valid_accuracy": v, "test_accuracy": v}
            for lr, v in ((1e-3, 0.5), (1e-2, 0.9), (1e-1, 0.7)) for s in (0, 1)]  # fmt: skip
    inside = point_stats(rows, experiment)
    assert (inside.learning_rate, inside.at_edge) == (1e-2, False)
    assert [lr for lr, _, _ in inside.by_learning_rate] == [1e-3, 1e-2, 1e-1]
    edge = point_stats([r for r in rows if r["learning_rate"] != 1e-2], experiment)
    assert (edge.learning_rate, edge.at_edge) == (1e-1, True)
    tie = [r | {"valid_accuracy": 0.9} for r in rows]  # an interior rate ties: no edge flag
    assert point_stats(tie, experiment).at_edge is False


def test_sweep_end_to_end_picks_best_learning_rate_and_writes_verdict(smoke_config, tmp_path):
    seen = []

    def rule(summary):
        seen.append(summary)
        return "inconclusive", "smoke run"

    experiment = Experiment(
        name="smoke",
        claim_id="X1",
        claim="a smoke test",
        base=smoke_config,
        points=grid(**{"model.heads": [1, 2]}),
        metric="accuracy",
        verdict=rule,
        learning_rates=(1e-3, 1e-2),
        solved_at=0.9,
    )
    outcome = sweep(experiment, tmp_path, num_seeds=2)
    summary = outcome.summary
    assert (outcome.claim_id, outcome.verdict, outcome.reason) == (
        "X1",
        "inconclusive",
        "smoke run",
    )
    assert seen == [summary] and [p for p, _ in summary] == list(experiment.points)
    rows = read_csv(tmp_path / "results.csv")
    columns = ["point", "model.heads", "seed", "learning_rate", "chosen", "params"]
    assert list(rows[0])[:7] == [*columns, "valid_accuracy"]
    assert len(rows) == 8  # 2 points x 2 seeds x 2 learning rates
    for point, stats in summary:
        point_rows = [r for r in rows if r["model.heads"] == str(point["model.heads"])]
        chosen = [r for r in point_rows if r["chosen"] == "True"]
        assert {float(r["learning_rate"]) for r in chosen} == {stats.learning_rate}
        values = [float(r["test_accuracy"]) for r in chosen]
        assert math.isclose(stats.mean, sum(values) / 2, rel_tol=1e-9)
        by_lr = {}
        for r in point_rows:
            by_lr.setdefault(float(r["learning_rate"]), []).append(float(r["valid_accuracy"]))
        assert stats.learning_rate == max(by_lr, key=lambda lr: sum(by_lr[lr]))
        assert {r["seed"] for r in chosen} == {"0", "1"}  # each seed has its own test draw
    assert "**Verdict (X1): inconclusive.** smoke run" in outcome.body
    assert "solved (≥ 0.9)" in outcome.body and "lr 0.01" in outcome.body
    assert (tmp_path / "summary.png").exists()

    bad = dataclasses.replace(experiment, verdict=lambda s: ("maybe", ""))
    with pytest.raises(ValueError, match="verdict"):
        sweep(bad, tmp_path, num_seeds=2)


def test_learning_rates_may_be_a_grid_per_point(smoke_config):
    points = grid(**{"optim.optimizer": ["adamw", "sgd"]})
    per_point = {"adamw": (1e-3, 1e-2), "sgd": (0.1,)}
    experiment = Experiment(
        name="x", claim_id="X1", claim="-", base=smoke_config, points=points, metric="accuracy",
        verdict=lambda s: ("inconclusive", "-"),
        learning_rates=lambda p: per_point[p["optim.optimizer"]],
    )  # fmt: skip
    assert [experiment.rates(p) for p in points] == [(1e-3, 1e-2), (0.1,)]
    shared = dataclasses.replace(experiment, learning_rates=(1e-3,))
    assert [shared.rates(p) for p in points] == [(1e-3,), (1e-3,)]
    stats = [Stats(0.9, 0.0, (0.9,), lr, 1, ((lr, 0.9, 0.9),)) for lr in (1e-3, 0.1)]
    tables = sweep_tables(experiment, Summary(list(zip(points, stats, strict=True))))
    assert "best learning rate of its grid" in tables and "lr 0.1" in tables
