"""cosine_bound (S4) redesign: its checks, and its rule on constructed rows (every verdict
reachable, edges and the detector voiding refutations or the verdict, the pilot seeds
refused)."""

import pytest

from attnjax.experiment import load_file
from attnjax.experiment.recompute import Differs
from tests.experiment.conftest import EXPERIMENTS

module = load_file(EXPERIMENTS / "cosine_bound.py")


def _rows(top=0.85, learn=1.0, fixed=0.3, seeds=range(5, 10), fixed_top=0.04, lr=0.01):
    """Constructed record rows: per seed, fixed g = 1 and learnable from 1 (its values spread
    by ±0.01 over seeds; its chosen rate ``lr``)."""
    rows = []
    for i, seed in enumerate(seeds):
        wobble = 0.01 * (-1) ** i
        points = ((module.FIXED_ONE, fixed, fixed_top),
                  (module.LEARN_ONE, learn - abs(wobble), top + wobble))  # fmt: skip
        for point, acc, weight in points:
            fixed_point = point == module.FIXED_ONE
            rows.append({"point": point, "seed": seed, "learning_rate": 0.01 if fixed_point
                         else lr, "rates": "0.001 0.003 0.01 0.03", "test_accuracy": acc,
                         "mean_top_weight": weight, "max_top_weight": weight + 0.02,
                         "scale": 1.0 if fixed_point else 6.0, "initial_scale": 1.0,
                         "learnable": not fixed_point})  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("rows", "verdict"),
    [
        (_rows(), "supported"),
        (_rows(top=0.09), "refuted"),  # (A) the scale stays capped
        (_rows(top=0.09, learn=0.5), "refuted"),  # both refuted
        (_rows(learn=0.5), "inconclusive"),  # left the cap, did not solve the task
        (_rows(fixed=0.95), "inconclusive"),  # fixed g = 1 solves it too
        (_rows(top=0.1045), "inconclusive"),  # (A) straddles the cap
        (_rows(top=0.09, lr=0.03), "inconclusive"),  # refuted at the grid's top rate
        (_rows(lr=0.03), "supported"),  # support at an edge rate stands
    ],
)
def test_every_verdict_is_reachable(rows, verdict):
    got, reason = module.judge(rows)
    assert got == verdict and reason.startswith("Judged: a scale learnable from g = 1")


def test_reasons_name_the_edge_and_the_unsolved_task():
    assert "not converged in rate" in module.judge(_rows(top=0.09, lr=0.03))[1]
    assert "not a refutation of 'removes the cap'" in module.judge(_rows(learn=0.5))[1]


def test_the_cap_check_and_the_initial_scales():
    assert module.cap_holds() and module.recorded_scales(_rows())
    assert not module.recorded_scales([{**_rows()[0], "learnable": True}])
    assert module.initial_scale(module.POINTS[module.LEARN_ONE]) == (1.0, True)
    assert module.initial_scale(module.POINTS[module.FIXED_ONE]) == (1.0, False)


def test_report_counts_runs_above_the_cap_and_refuses_pilot_seeds():
    caught = module.report_from_rows({"results.csv": _rows(fixed_top=0.2)})
    assert "5 fixed-g = 1 runs with a test row above the query row's cap 0.1035 — a BUG" in (
        caught.body
    )
    assert caught.verdicts["S4"][0] == "inconclusive"
    clean = module.report_from_rows({"results.csv": _rows()})
    assert "0 fixed-g = 1 runs" in clean.body and "FAIL" not in clean.body
    assert clean.verdicts["S4"][0] == "supported" and "interior" in clean.body
    # 0.1036 is under the claim's 0.1050 but over the query row's 0.1035 cap: detected
    assert "1 fixed-g = 1 runs" in module.report_from_rows(
        {"results.csv": [{**r, "max_top_weight": 0.1036} if i == 0 else r
                         for i, r in enumerate(_rows())]}).body  # fmt: skip
    with pytest.raises(Differs, match="pilot seeds"):
        module.report_from_rows({"results.csv": _rows(seeds=range(3, 8))})
