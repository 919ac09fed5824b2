"""head_averaging (M4) redesign: its definitions on constructed maps (sharp heads are unimodal,
averaging creates the modes), its rule on constructed rows (every verdict reachable) and the
pilot seeds refused."""

import numpy as np
import pytest

from attnjax.experiment import load_file
from attnjax.experiment.recompute import Differs
from tests.experiment.conftest import EXPERIMENTS

module = load_file(EXPERIMENTS / "head_averaging.py")


def _causal_maps(offsets, t=12):
    """One layer ``[1, N, T, T]``: head n puts 0.9 on key ``max(t − offsets[n], 0)`` and spreads
    0.1 over the other visible keys (causal)."""
    w = np.zeros((1, len(offsets), t, t))
    for n, offset in enumerate(offsets):
        for row in range(t):
            w[0, n, row, : row + 1] = 0.1 / max(row, 1) if row else 1.0
            w[0, n, row, max(row - offset, 0)] = 0.9 if row else 1.0
    return w


def test_definitions_and_can_witness_checks_pass():
    assert module._definitions_hold() and module._can_witness()


def test_disjoint_sharp_heads_create_modes_and_agreeing_ones_do_not():
    apart = module.seed_stats([_causal_maps((1, 2))])
    assert apart["sharp_rows"] == 1.0 and apart["single_multimodal"] == 0.0
    assert apart["average_multimodal"] == 1.0 and apart["two_key_offsets"] == 0.0
    together = module.seed_stats([_causal_maps((1, 1))])
    assert together["average_multimodal"] == 0.0 and together["sharp_rows"] == 1.0
    current_and_previous = module.seed_stats([_causal_maps((0, 1, 1))])
    assert current_and_previous["two_key_offsets"] == 1.0
    assert current_and_previous["strict_average_multimodal"] == 1.0
    bimodal = _causal_maps((1, 2))
    bimodal[0, 0, :, 0] += 0.3  # head 0 now has a second mode: not sharp, so no pair left
    assert module.seed_stats([bimodal])["sharp_rows"] == 0.0


def _rows(created, share=0.6, seeds=range(5, 10)):
    return [{"point": "trained", "seed": s, "sharp_rows": share + 0.01 * (-1) ** s,
             "average_multimodal": created + 0.02 * (-1) ** s, "single_multimodal": 0.0,
             "two_key_offsets": 0.2, "strict_average_multimodal": created,
             "all_heads_multimodal": 0.5,
             "any_head_multimodal": 0.1, "entropy_gap": 0.3, "heads_entropy": 0.4}
            for s in seeds]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "verdict"),
    [
        (_rows(0.7), "supported"),
        (_rows(0.01), "refuted"),
        (_rows(0.2), "inconclusive"),
        (_rows(0.7, share=0.05), "inconclusive"),  # too few rows with two sharp heads
    ],
)
def test_every_verdict_is_reachable(rows, verdict):
    got, reason = module.judge(rows)
    assert got == verdict and reason.startswith("Judged as *does*")
    assert ("sharp heads agree on their key" in reason) == (verdict == "refuted")


def test_report_checks_the_selection_and_refuses_pilot_seeds():
    body = module.report_from_rows({"results.csv": _rows(0.7)}).body
    assert "FAIL" not in body and "100.0% of draws give the verdict supported" in body
    leaky = _rows(0.7)
    leaky[0]["single_multimodal"] = 0.1
    assert "(measured): FAIL" in module.report_from_rows({"results.csv": leaky}).body
    with pytest.raises(Differs, match="pilot seeds"):
        module.report_from_rows({"results.csv": _rows(0.7, seeds=range(3))})
