"""Records that check themselves: ``attnjax claims --check`` fails, naming the record and what
differs, when a value of a committed table changes. That every committed ``report.md`` is what
its tables give is ``attnjax claims --check``'s own run over every record, which CI makes after
the suite (the same computation; the suite does not repeat it)."""

import pathlib
import shutil

import jax
import pytest

from attnjax import cli
from attnjax.experiment import recompute
from attnjax.experiment.storage import read_csv, write_csv

ROOT = pathlib.Path(__file__).parents[2]


def _repository(tmp_path: pathlib.Path, *records: str) -> pathlib.Path:
    """A copy of the repository's docs and of its ``records`` (only these: ``attnjax claims
    --check`` recomputes every record it finds), its experiments and configs linked."""
    for name in records:
        shutil.copytree(ROOT / "results" / name, tmp_path / "results" / name)
    (tmp_path / "docs").mkdir()
    for path in ("docs/claims.md", "README.md"):
        shutil.copy(ROOT / path, tmp_path / path)
    for folder in ("experiments", "configs"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    return tmp_path


def _change(path: pathlib.Path, column: str, change, row: int | None = None) -> None:
    """Apply ``change`` to ``column`` of one row (``row``) or of every row of a CSV."""
    rows = read_csv(path)
    for i, r in enumerate(rows):
        if row is None or i == row:
            r[column] = str(change(r[column]))
    write_csv(path, rows)


@pytest.fixture(autouse=True)
def _rank_promotion_allowed():
    """dk_scaling's sweep measures its logit variance at initialization on the xor_relation
    task, whose generator broadcasts implicitly."""
    with jax.numpy_rank_promotion("allow"):
        yield


def test_check_fails_when_a_trained_sweeps_results_change(tmp_path):
    root = _repository(tmp_path, "xor_relation")
    assert recompute.differences(root, ["xor_relation"]) == ([], [])
    _change(root / "results" / "xor_relation" / "results.csv", "test_accuracy",
            lambda v: float(v) / 2)  # fmt: skip
    with pytest.raises(SystemExit, match=r"results/xor_relation/report\.md differs from its "
                       r"tables: line \d+: the report has '.*', its tables give"):  # fmt: skip
        cli.main(["claims", "--root", str(root), "--check"])


def test_one_changed_value_of_a_trained_sweep_is_found(tmp_path):
    root = _repository(tmp_path, "xor_relation")
    path = root / "results" / "xor_relation" / "results.csv"
    chosen = next(i for i, r in enumerate(read_csv(path)) if r["chosen"] == "True")
    _change(path, "test_accuracy", lambda v: float(v) - 0.01, row=chosen)
    (found,), _ = recompute.differences(root, ["xor_relation"])
    assert found.startswith("results/xor_relation/report.md differs from its tables: line ")


@pytest.mark.parametrize(
    ("column", "change", "message"),
    [
        (
            "chosen",
            lambda v: v == "False",
            "results.csv line 2, chosen: 'True', but its rows give 'False'",
        ),
        (
            "model.heads",
            lambda v: int(v) + 1,
            "results.csv line 2, model.heads: '2', but its rows give '1'",
        ),
    ],
)
def test_a_changed_choice_or_override_of_a_trained_sweep_is_found(
    tmp_path, column, change, message
):
    root = _repository(tmp_path, "xor_relation")
    _change(root / "results" / "xor_relation" / "results.csv", column, change, row=0)
    assert recompute.differences(root, ["xor_relation"]) == (
        [f"results/xor_relation: {message}"],
        [],
    )


@pytest.mark.parametrize(
    ("record", "table", "column"),
    [
        ("activation", "analysis.csv", "init saturated"),  # the analysis's own table
        ("activation", "results.csv", "test_loss"),  # the sweep it judges on
        ("temperature", "results.csv", "entropy"),
        ("entropy_collapse", "results.csv", "min_entropy"),
    ],
)
def test_one_changed_value_of_an_analysis_is_found(tmp_path, record, table, column):
    root = _repository(tmp_path, record)
    _change(root / "results" / record / table, column, lambda v: float(v) / 2 + 0.1, row=0)
    (found,), _ = recompute.differences(root, [record])
    assert found.startswith(f"results/{record}/report.md differs from its tables: line ")


def test_an_analysis_without_report_from_rows_is_named_not_checked(tmp_path):
    root = tmp_path
    (root / "results" / "temperature").mkdir(parents=True)
    (root / "results" / "temperature" / "report.md").write_text("verdict S5: supported\n")
    (root / "experiments").mkdir()
    (root / "experiments" / "temperature.py").write_text("def analyze(out, smoke): ...\n")
    assert recompute.differences(root, ["temperature"]) == (
        [],
        ["results/temperature: temperature.py defines no report_from_rows(tables)"],
    )
