"""The multi-head and positional experiments' smoke variants, end to end through
``attnjax sweep``."""

import pytest

from attnjax.experiment.sweep import VERDICTS

OUTPUTS = {
    "head_diversity": ["analysis.md", "head_diversity.png", "report.md", "summary.png"],
    "head_pruning": ["analysis.md", "head_pruning.png"],
    "positional_amplitude": ["analysis.md", "positional_amplitude.png", "report.md"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_smoke_end_to_end(name, run_smoke):
    printed, out = run_smoke(name)
    assert any(f"verdict: {v}." in printed for v in VERDICTS)
    for output in OUTPUTS[name]:  # analyze() writes analysis.md, a sweep report.md
        assert (out / output).stat().st_size > 0
