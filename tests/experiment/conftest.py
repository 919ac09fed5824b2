import json
import pathlib
import re

import pytest

from attnjax.cli import main
from attnjax.experiment import load_file
from attnjax.experiment.storage import read_csv


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


def check_smoke(run_smoke, name: str, claims: list[str], figures: list[str]) -> None:
    """``attnjax sweep experiments/<name>.py --smoke`` prints a verdict line per claim and
    writes the record (:func:`check_record`)."""
    printed, out = run_smoke(name)
    check_record(out, claims, figures)
    assert all(f"verdict {c.lower()}: " in printed for c in claims)


def check_record(out: pathlib.Path, claims: list[str], figures: list[str]) -> None:
    """``out`` holds an experiment's record: ``report.md`` opening with one verdict line per
    claim, ``results.csv`` with ``point`` and ``seed`` columns, ``env.json`` with the command,
    and the ``figures``."""
    lines = (out / "report.md").read_text().splitlines()
    pattern = r"verdict (.+): (supported|refuted|inconclusive)"
    judged = [re.fullmatch(pattern, line).group(1) for line in lines[: len(claims)]]
    assert judged == claims and lines[len(claims)] == ""
    rows = read_csv(out / "results.csv")
    assert rows and {"point", "seed"} <= set(rows[0])
    assert json.loads((out / "env.json").read_text())["command"].startswith("attnjax sweep")
    for figure in figures:
        assert (out / figure).stat().st_size > 1000
