import pathlib

import pytest

from attnjax.cli import main
from attnjax.experiment import load_file


@pytest.fixture(scope="session")
def smoke_config():
    """The XOR relation config's seconds-long variant (20 steps, 2 evaluations)."""
    return load_file(pathlib.Path(__file__).parents[2] / "configs" / "xor_relation.py").get_config(
        "smoke"
    )


EXPERIMENTS = pathlib.Path(__file__).parents[2] / "experiments"


@pytest.fixture
def run_smoke(tmp_path, capsys):
    """``run_smoke(name) -> (printed lowercase, out folder)`` of
    ``attnjax sweep experiments/<name>.py --smoke --seeds 1``."""

    def run(name: str) -> tuple[str, pathlib.Path]:
        args = ["sweep", str(EXPERIMENTS / f"{name}.py"), "--smoke", "--seeds", "1"]
        main([*args, "--out", str(tmp_path)])
        return capsys.readouterr().out.lower(), tmp_path

    return run
