"""The multi-head and positional experiments' smoke variants, end to end through
``attnjax sweep``: each writes its record (verdict lines, results, environment, figures)."""

import pytest

from tests.experiment.conftest import check_record

RECORDS = {  # claims judged, figures
    "head_diversity": (["M1"], ["head_diversity.png", "summary.png"]),
    "head_pruning": (["M2"], ["summary.png"]),
    "positional_amplitude": (["S7"], ["positional_amplitude.png", "summary.png"]),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_smoke_end_to_end(name, run_smoke):
    printed, out = run_smoke(name)
    claims, figures = RECORDS[name]
    check_record(out, claims, figures)
    assert all(f"verdict {c.lower()}: " in printed for c in claims)
