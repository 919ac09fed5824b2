"""The entropy-collapse experiment's (S9) design: its events on constructed trajectories, its
interval arithmetic against published values, and every verdict reachable on constructed
rows."""

import numpy as np
import pytest

from attnjax.experiment import load_file
from tests.experiment.conftest import EXPERIMENTS

ec = load_file(EXPERIMENTS / "entropy_collapse.py")


def test_events_from_step_one():
    assert ec.spike_step(np.array([3.0, 2.0, 2.2, 1.9])) is None  # +0.2: no spike
    assert ec.spike_step(np.array([3.0, 2.0, 2.1, 2.4])) == 3  # against the running minimum
    assert ec.spike_step(np.array([3.0, 3.4, 1.0])) == 1  # the first step can spike
    assert ec.spike_step(np.array([3.0, np.nan, 1.0])) == 1
    assert ec.collapse_step(np.array([2.0, 0.5, 0.19, 0.0])) == 2  # below 0.1 × 2.0
    assert ec.collapse_step(np.array([2.0, np.nan, 0.3])) is None  # NaN is no collapse
    assert ec.collapse_step(np.array([2.0, 0.3]), 0.2) == 1


def test_intervals_match_published_values():
    # Newcombe (1998), example (a): 56/70 − 48/80, method 10: 0.0524 to 0.3339 (95%)
    d, lower, upper = ec.newcombe(56, 70, 48, 80, confidence=0.975)
    assert d == pytest.approx(0.2) and lower == pytest.approx(0.0524, abs=1e-4)
    assert upper == pytest.approx(0.3339, abs=1e-4)
    assert ec.wilson(0, 10, 0.975)[1] == pytest.approx(0.2775, abs=1e-4)  # Wilson 0/10


def _rows(collapse_spike, qk_rows=()):
    """Rows (no QK-norm at the unstable rate 1.0, then ``qk_rows`` with QK-norm) from
    ``(collapse step, spike step)`` pairs, every column of the record; the i-th of each variant
    share seed i."""
    rows = []
    for qk, pairs in ((False, collapse_spike), (True, qk_rows)):
        for i, (c, s) in enumerate(pairs):
            rows.append({"point": ec._point(qk, 1.0), "qk_norm": qk, "seed": i,
                         "learning_rate": 1.0, "collapse_step": c, "spike_step": s,
                         "spike_step_0.2": s, "spike_step_0.5": None,
                         "collapse_step_0.05": c, "collapse_step_0.2": None,
                         "initial_entropy": 1.7, "min_entropy": 0.1,
                         "final_loss": 3.0 if s else 2.0})  # fmt: skip
    return rows


def test_parts_reach_every_verdict():
    assert ec.judge_association(ec.association([(5, 9)] * 20 + [(None, None)] * 20))\
        == "supported"  # fmt: skip
    assert ec.judge_association(ec.association([(5, None)] * 20 + [(None, 9)] * 20))\
        == "refuted"  # fmt: skip
    assert ec.judge_association(ec.association([(5, 9)] * 4)) == "inconclusive"
    assert ec.judge_accompaniment(18, 20) == "supported"
    assert ec.judge_accompaniment(2, 20) == "refuted"
    assert ec.judge_accompaniment(10, 20) == "inconclusive"
    assert ec.judge_accompaniment(4, 4) == "inconclusive"  # too few spikes


def test_accompaniment_counts_either_side_within_the_window():
    found = [(10, 50), (90, 50), (91, 50), (50, 50), (None, 50), (3, None)]
    assert ec.accompanied(found, 40) == (3, 5)  # 91 is 41 steps after; no collapse: against
    assert ec.preceding(found) == (1, 1)


def test_rule_is_supported_and_refuted_on_constructed_rows():
    stable = [(None, None)] * 10
    claim = _rows([(3, 7)] * 10 + stable, [(None, 4)] * 20)  # QK-norm runs are not judged
    against = _rows([(3, None)] * 10 + [(None, 4)] * 10, stable * 2)
    for rows, verdict in ((claim, "supported"), (against, "refuted")):
        assert ec.report_from_rows({"results.csv": rows}).verdicts["S9"][0] == verdict


def test_every_stored_column_reaches_the_record():
    rows = _rows([(3, 7)] * 6 + [(None, None)] * 6, [(None, 4)] * 12)
    body = ec.report_from_rows({"results.csv": rows}).body
    for key in rows[0]:
        if key in ("point", "qk_norm", "seed", "learning_rate"):
            continue  # they sort the rows into the table's cells
        changed = [dict(r) for r in rows]
        value = changed[0][key]
        changed[0][key] = 0.57 * value if isinstance(value, float) else 2 if value else 1
        assert ec.report_from_rows({"results.csv": changed}).body != body, key


def test_record_refuses_pilot_seeds_and_points_unlike_their_columns():
    rows = _rows([(3, 7)] * 6)
    for key, value, message in (("seed", ec.PILOT_SEEDS[0], "pilot seeds"),
                                ("learning_rate", 3.0, "disagree")):  # fmt: skip
        with pytest.raises(ec.Differs, match=message):
            ec.report_from_rows({"results.csv": [rows[0] | {key: value}, *rows[1:]]})


def test_reductions_pair_seeds_at_unstable_rates():
    rows = _rows([(3, 7), (3, None), (None, None)], [(None, None), (3, None), (None, None)])
    rows.append({**rows[0], "learning_rate": 0.01, "collapse_step": 1})  # not an unstable rate
    cut = ec.reductions(rows)
    assert cut["collapse_step"][0] == pytest.approx(1 / 3)
    assert cut["spike_step"][0] == pytest.approx(1 / 3)
    d, lower, upper = ec.paired_reduction([False] * 30, [False] * 30)  # all pairs agree
    assert d == 0 and lower < 0 < upper < ec.MARGIN
