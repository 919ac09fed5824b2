import pathlib

import pytest

from attnjax.cli import main
from attnjax.experiment import load_file
from attnjax.experiment.sweep import VERDICTS


@pytest.fixture(scope="session")
def smoke_config():
    """The XOR relation config's seconds-long variant (20 steps, 2 evaluations)."""
    return load_file(pathlib.Path(__file__).parents[2] / "configs" / "xor_relation.py").get_config(
        "smoke"
    )


EXPERIMENTS = pathlib.Path(__file__).parents[2] / "experiments"


@pytest.fixture
def run_smoke(tmp_path, capsys):
    """``run_smoke(name, outputs)``: ``attnjax sweep experiments/<name>.py --smoke`` prints a
    verdict and writes every file of ``outputs`` (analyze() writes analysis.md, a sweep
    report.md) non-empty."""

    def run(name: str, outputs: list[str]) -> None:
        args = ["sweep", str(EXPERIMENTS / f"{name}.py"), "--smoke", "--seeds", "1"]
        main([*args, "--out", str(tmp_path)])
        printed = capsys.readouterr().out.lower()
        assert any(f"verdict: {v}." in printed for v in VERDICTS)
        for output in outputs:
            assert (tmp_path / output).stat().st_size > 0

    return run
