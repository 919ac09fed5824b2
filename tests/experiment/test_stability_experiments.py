"""Each stability experiment's smoke variant, end to end through ``attnjax sweep``.

The multi-head and positional experiments are in test_multihead_experiments.py, so that the
two test workers (``--dist loadfile``) share the load."""

import pytest

from tests.experiment.conftest import smoke_verdicts

RECORDS = {  # claims judged, figures
    "activation": (["S8"], ["summary.png", "activation.png"]),
    "dk_scaling": (["S1", "S2"], ["dk_scaling_init.png", "summary.png"]),
    "gradient_path": (["E7"], ["summary.png"]),
    "qk_norm": (["S6"], ["summary.png"]),
    "temperature": (["S5"], ["summary.png"]),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_smoke_end_to_end(name, run_smoke):
    claims, figures = RECORDS[name]
    assert smoke_verdicts(run_smoke, name, figures) == (claims, claims)
