"""The command line's promises: a folder belongs to the command that wrote it (``run`` and
``sweep`` refuse each other's folders and foreign records unless ``--overwrite``, and resume
their own); every user error is one line, exit status 2, before any folder is made; a smoke
run judges no claim."""

import json
import pathlib
import sys

import pytest

from attnjax import cli
from attnjax.experiment.storage import read_csv

ROOT = pathlib.Path(__file__).parents[2]
CONFIG = str(ROOT / "configs" / "xor_relation.py")
TINY = (
    "from attnjax.experiment import Experiment, load_file\n"
    f"base = load_file({CONFIG!r}).get_config('smoke')\n"
    "def get_experiment(smoke=False):\n"
    "    return Experiment(name='tiny', claim_id='T1', claim='a test', base=base,\n"
    "        points=({'model.heads': 1},), metric='accuracy',\n"
    "        verdict=lambda summary: ('supported', 'a test'))\n"
)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def _refused(capsys, command: list[str]) -> str:
    """The one-line error of ``command``, which must exit with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(command)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_run_and_sweep_refuse_each_others_folders_and_resume_their_own(tiny, tmp_path, capsys):
    run_dir, sweep_dir = tmp_path / "run", tmp_path / "sweep"
    run = ["run", CONFIG, "--smoke", "--seeds", "1", "--out", str(run_dir)]
    sweep = ["sweep", tiny, "--smoke", "--seeds", "1", "--out", str(sweep_dir)]
    cli.main(run)
    assert json.loads((run_dir / "written_by.json").read_text())["kind"] == "run"
    assert (run_dir / "report.md").read_text().startswith("# xor_relation (smoke)\n")
    checkpoint = sorted((run_dir / "checkpoints").iterdir())
    cli.main(run)  # its own folder: resumed (finished), nothing retrained
    assert sorted((run_dir / "checkpoints").iterdir()) == checkpoint
    cli.main(sweep)
    printed = capsys.readouterr().out
    assert "verdict T1: not judged (smoke)" in printed and "verdict T1: supported" not in printed
    report = (sweep_dir / "report.md").read_text()
    assert report.startswith("verdict T1: not judged (smoke)\n\n**Smoke run**")
    assert "# tiny (smoke)" in report
    assert _refused(capsys, [*sweep, "--publish"]).endswith(
        "--publish: a smoke run is not a record; drop --smoke or --publish\n"
    )

    run_files, sweep_files = _files(run_dir), _files(sweep_dir)
    into_run = [*sweep[:-1], str(run_dir)]
    into_sweep = [*run[:-1], str(sweep_dir)]
    assert "written_by" not in _refused(capsys, into_run)  # names the command instead:
    assert f"holds the record of `attnjax {' '.join(run)}`" in _refused(capsys, into_run)
    assert "--overwrite" in _refused(capsys, into_sweep)
    assert _files(run_dir) == run_files and not (run_dir / "points").exists()
    assert _files(sweep_dir) == sweep_files and not (sweep_dir / "config.json").exists()

    cli.main([*into_sweep, "--overwrite"])  # takes it, removes only the run's own files
    assert json.loads((sweep_dir / "written_by.json").read_text())["kind"] == "run"
    assert (sweep_dir / "points").is_dir() and (sweep_dir / "summary.png").exists()
    assert (sweep_dir / "report.md").read_text().startswith("# xor_relation")
    cli.main([*into_run, "--overwrite"])
    assert json.loads((run_dir / "written_by.json").read_text())["kind"] == "sweep"
    assert (run_dir / "checkpoints").is_dir()  # the run's, left alone
    assert read_csv(run_dir / "results.csv")[0]["point"] == "heads=1"


def test_a_record_no_command_wrote_is_refused(tiny, tmp_path, capsys):
    (tmp_path / "results.csv").write_text("a\n1\n")
    for command in (["run", CONFIG], ["sweep", tiny]):
        err = _refused(capsys, [*command, "--smoke", "--out", str(tmp_path)])
        assert "a record (results.csv) that no `attnjax" in err and "--overwrite" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "tiny.py"]


def test_a_folder_of_figures_no_command_wrote_is_refused(tmp_path, capsys):
    (tmp_path / "summary.png").write_bytes(b"png")
    err = _refused(capsys, ["run", CONFIG, "--smoke", "--out", str(tmp_path)])
    assert "a record (summary.png) that no `attnjax" in err
    assert [p.name for p in tmp_path.iterdir()] == ["summary.png"]


@pytest.mark.parametrize(
    "command, message",
    [
        (["run", CONFIG, "--seeds", "0"], "argument --seeds: expected a positive integer, got '0'"),
        (["run", CONFIG, "--seeds", "-1"], "argument --seeds: expected a positive integer"),
        (["sweep", "TINY", "--seeds", "0"], "argument --seeds: expected a positive integer"),
        (["sweep", "TINY", "--workers", "0"], "argument --workers: expected a positive integer"),
        (["run", CONFIG, "--tensorboard"], 'install it with pip install -e ".[tensorboard]"'),
        (["sweep", "TINY", "--tensorboard"], 'install it with pip install -e ".[tensorboard]"'),
        (["run", str(ROOT / "experiments" / "copy.py")],
         "defines no get_config(variant); an experiment file runs with `attnjax sweep`"),
        (["sweep", CONFIG], "defines neither analyze() nor get_experiment(); a config file runs "
                            "with `attnjax run`"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_before_any_folder(
    command, message, tiny, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # not installed
    out = tmp_path / "out"
    command = [tiny if c == "TINY" else c for c in command]
    err = _refused(capsys, [*command, "--smoke", "--out", str(out)])
    assert err.startswith(f"attnjax {command[0]}: error: ") and message in err
    assert not out.exists()


def test_help_gives_smoke_its_real_cost(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "judges no claim" in text and "2.6 min" in text and "seconds-long" not in text
