"""Every experiment file's smoke sweep, end to end: configs load, points train, the verdict
rule reads the summary. A smoke run's verdict carries no meaning."""

import pathlib

import pytest

from attnjax.experiment import load_file, sweep
from attnjax.experiment.sweep import VERDICTS

EXPERIMENTS = ["xor_bits", "min_of_keys", "impostor", "mqa_ordering", "copy", "mqar"]
ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_smoke_sweep_runs_end_to_end(name, tmp_path):
    experiment = load_file(ROOT / "experiments" / f"{name}.py").get_experiment(smoke=True)
    summary, verdict, reason = sweep(experiment, tmp_path, num_seeds=1)
    assert len(summary) == len(experiment.points) and verdict in VERDICTS and reason
    assert (tmp_path / "report.md").exists() and (tmp_path / "summary.png").exists()
