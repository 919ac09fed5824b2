"""The dot-vs-general (S3), cosine-bound (S4) and entropy-collapse (S9) experiments: their
measurements and rules on constructed inputs, and their smoke variants end to end through
``attnjax sweep``."""

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
