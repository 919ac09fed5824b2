"""Each stability experiment's smoke variant, end to end through ``attnjax sweep``.

The multi-head and positional experiments are in test_multihead_experiments.py, so that the
two test workers (``--dist loadfile``) share the load."""

import pytest

from attnjax.experiment.sweep import VERDICTS

OUTPUTS = {
    "activation": ["analysis.md", "activation.png"],
    "dk_scaling": ["analysis.md", "dk_scaling_init.png", "report.md", "summary.png"],
    "gradient_path": ["analysis.md", "gradient_path.png"],
    "qk_norm": ["analysis.md", "qk_norm.png"],
    "temperature": ["analysis.md", "temperature.png"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_smoke_end_to_end(name, run_smoke):
    printed, out = run_smoke(name)
    assert any(f"verdict: {v}." in printed for v in VERDICTS)
    for output in OUTPUTS[name]:  # analyze() writes analysis.md, a sweep report.md
        assert (out / output).stat().st_size > 0
