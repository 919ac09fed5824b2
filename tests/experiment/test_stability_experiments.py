"""Each stability experiment's smoke variant, end to end through ``attnjax sweep``."""

import pathlib

import pytest

from attnjax.cli import main
from attnjax.experiment.sweep import VERDICTS

EXPERIMENTS = pathlib.Path(__file__).parents[2] / "experiments"
OUTPUTS = {  # files each run must write: analyze() writes analysis.md, a sweep report.md
    "activation": ["analysis.md", "activation.png"],
    "dk_scaling": ["analysis.md", "dk_scaling_init.png", "report.md", "summary.png"],
    "gradient_path": ["analysis.md", "gradient_path.png"],
    "head_pruning": ["analysis.md", "head_pruning.png"],
    "temperature": ["analysis.md", "temperature.png"],
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_smoke_end_to_end(name, tmp_path, capsys):
    args = ["sweep", str(EXPERIMENTS / f"{name}.py"), "--smoke", "--seeds", "1"]
    main([*args, "--out", str(tmp_path)])
    printed = capsys.readouterr().out.lower()
    assert any(f"verdict: {v}." in printed for v in VERDICTS)
    for output in OUTPUTS[name]:
        assert (tmp_path / output).stat().st_size > 0
