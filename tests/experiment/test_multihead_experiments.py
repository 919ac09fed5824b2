"""The multi-head and positional experiments' smoke variants, end to end through
``attnjax sweep``."""

import pytest

OUTPUTS = {
    "head_diversity": ["analysis.md", "head_diversity.png", "report.md", "summary.png"],
    "head_pruning": ["analysis.md", "head_pruning.png"],
    "positional_amplitude": ["analysis.md", "positional_amplitude.png", "report.md"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_smoke_end_to_end(name, run_smoke):
    run_smoke(name, OUTPUTS[name])
