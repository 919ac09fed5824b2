import inspect
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
    ``attnjax sweep experiments/<name>.py --smoke --seeds 1`` (no ``--seeds`` for a
    measurement that takes none)."""

    def run(name: str) -> tuple[str, pathlib.Path]:
        module = load_file(EXPERIMENTS / f"{name}.py")
        seedless = not hasattr(module, "get_experiment") and "seeds" not in (
            inspect.signature(module.analyze).parameters
        )  # a measurement without seeds: --seeds would be an error
        seeds = [] if seedless else ["--seeds", "1"]
        args = ["sweep", str(EXPERIMENTS / f"{name}.py"), "--smoke", *seeds]
        main([*args, "--out", str(tmp_path)])
        return capsys.readouterr().out.lower(), tmp_path

    return run


def smoke_verdicts(run_smoke, name: str, figures: list[str]) -> tuple[list[str], list[str]]:
    """Run ``attnjax sweep experiments/<name>.py --smoke``; check that it wrote a record (a
    ``results.csv`` with ``point`` and ``seed`` columns, ``env.json`` with the command, the
    ``figures``) and return the claims named by ``report.md``'s opening verdict lines and by
    the printed ones: a smoke run judges none (``not judged (smoke)``), though each claim's
    rule ran (its verdict is in the report's body)."""
    printed, out = run_smoke(name)
    report = (out / "report.md").read_text()
    lines = report.splitlines()
    pattern = r"verdict (.+): not judged \(smoke\)"
    judged = [m.group(1) for line in lines if (m := re.fullmatch(pattern, line))]
    assert lines[len(judged)] == ""  # the verdict lines open the report
    for claim in judged:
        assert re.search(rf"\*\*Verdict \({claim}\): (supported|refuted|inconclusive)\.", report)
    rows = read_csv(out / "results.csv")
    assert rows and {"point", "seed"} <= set(rows[0])
    assert json.loads((out / "env.json").read_text())["command"].startswith("attnjax sweep")
    for figure in figures:
        assert (out / figure).stat().st_size > 1000
    said = [
        m.group(1).upper() for line in printed.splitlines() if (m := re.fullmatch(pattern, line))
    ]
    return judged, said
