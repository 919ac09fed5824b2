import dataclasses
import math

import pytest

from attnjax.experiment import Experiment, grid, label, sweep
from attnjax.experiment.storage import read_csv


def test_grid_is_a_cartesian_product_with_tied_fields():
    points = grid(**{"model.score+model.heads": [("dot", 1), ("additive", 2)], "t.e": ["x"]})
    assert points == (
        {"model.score": "dot", "model.heads": 1, "t.e": "x"},
        {"model.score": "additive", "model.heads": 2, "t.e": "x"},
    )
    assert grid(**{"a.b": [1, 2], "c.d": ["x", "y", "z"]})[-1] == {"a.b": 2, "c.d": "z"}
    assert label({"model.score": "dot", "model.heads": 2}) == "score=dot heads=2"


def test_sweep_end_to_end_picks_best_learning_rate_and_writes_verdict(smoke_config, tmp_path):
    seen = {}

    def rule(summary):
        seen.update(summary)
        return "inconclusive", "smoke run"

    experiment = Experiment(
        name="smoke",
        claim="a smoke test",
        base=smoke_config,
        points=grid(**{"model.heads": [1, 2]}),
        metric="accuracy",
        verdict=rule,
        learning_rates=(1e-3, 1e-2),
    )
    summary, verdict, _ = sweep(experiment, tmp_path, num_seeds=2)
    assert verdict == "inconclusive" and set(summary) == {"heads=1", "heads=2"}
    rows = read_csv(tmp_path / "results.csv")
    assert len(rows) == 4 and {r["point"] for r in rows} == set(summary)
    for name, stats in summary.items():
        point_rows = [r for r in rows if r["point"] == name]
        assert {float(r["learning_rate"]) for r in point_rows} == {stats.learning_rate}
        values = [float(r["test_accuracy"]) for r in point_rows]
        assert math.isclose(stats.mean, sum(values) / 2, rel_tol=1e-9)
        all_runs = read_csv(next((tmp_path / "points").glob(f"*{name}*")) / "results.csv")
        by_lr = {}
        for r in all_runs:
            by_lr.setdefault(float(r["learning_rate"]), []).append(float(r["valid_accuracy"]))
        assert stats.learning_rate == max(by_lr, key=lambda lr: sum(by_lr[lr]))
    report = (tmp_path / "report.md").read_text()
    assert "**Verdict: inconclusive.** smoke run" in report and (tmp_path / "summary.png").exists()

    bad = dataclasses.replace(experiment, verdict=lambda s: ("maybe", ""))
    with pytest.raises(ValueError, match="verdict"):
        sweep(bad, tmp_path, num_seeds=2)
