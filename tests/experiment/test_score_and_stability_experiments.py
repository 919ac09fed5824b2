"""The dot-vs-general (S3), cosine-bound (S4) and entropy-collapse (S9) experiments: their
measurements and rules on constructed inputs, and their smoke variants end to end through
``attnjax sweep``."""

import numpy as np
import pytest

from attnjax.experiment import load_file
from tests.experiment.conftest import EXPERIMENTS, smoke_verdicts

RECORDS = {
    "cosine_bound": (["S4"], ["summary.png"]),
    "entropy_collapse": (["S9"], ["summary.png"]),
    "luong_scores": (["S3"], ["summary.png"]),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_smoke_end_to_end(name, run_smoke):
    claims, figures = RECORDS[name]
    assert smoke_verdicts(run_smoke, name, figures) == (claims, claims)


def test_spike_and_collapse_steps():
    module = load_file(EXPERIMENTS / "entropy_collapse.py")
    steps = np.array([20, 40, 60, 80])
    assert module.spike_step(np.array([3.0, 2.0, 2.2, 1.9]), steps) is None  # +0.2: no spike
    assert module.spike_step(np.array([3.0, 2.0, 2.1, 2.4]), steps) == 80
    assert module.spike_step(np.array([3.0, np.nan, 1.0, 1.0]), steps) == 40
    assert module.first_below(np.array([2.0, 0.5, 0.1, 0.0]), steps, 0.3) == 60
    assert module.first_below(np.array([2.0, 0.5]), steps[:2], 0.3) is None
    metrics = [{"split": "train", "metric": "loss", "seed": 0, "learning_rate": 0.1, "step": s,
                "value": float(s)} for s in (40, 20)]  # fmt: skip
    metrics += [{"split": "valid", "metric": "attention_entropy", "seed": 0, "learning_rate": 0.1,
                 "step": s, "value": -float(s)} for s in (20, 40)]  # fmt: skip
    run = module.trajectories(metrics)[0, 0.1]
    assert run["step"].tolist() == [20, 40] and run["loss"].tolist() == [20.0, 40.0]
    assert run["entropy"].tolist() == [-20.0, -40.0]


def test_luong_winner_needs_separate_intervals():
    from attnjax.experiment import Stats

    module = load_file(EXPERIMENTS / "luong_scores.py")

    def loss(mean):
        return Stats(mean, 0.05, (mean,), 1e-3, 1)

    assert module.winner(loss(1.0), loss(0.8)) == "general"
    assert module.winner(loss(0.8), loss(1.0)) == "dot"
    assert module.winner(loss(1.0), loss(0.95)) == "tie"
    assert module.verdict({"a": "dot", "b": "tie"}) == "supported"
    assert module.verdict({"a": "dot", "b": "general"}) == "refuted"
