"""Every training experiment file: its points' configs validate, its verdict rule reads a
summary of every point, and one point per distinct model kind trains end to end through
``sweep`` (the full grids run in the experiments themselves, not in the suite)."""

import dataclasses
import math
import pathlib

import pytest

from attnjax.experiment import Stats, Summary, load_file, sweep, with_overrides
from attnjax.experiment.sweep import VERDICTS

EXPERIMENTS = ["xor_relation", "xor_bits", "min_of_keys", "impostor", "mqa_ordering", "copy",
               "mqar"]  # fmt: skip
ROOT = pathlib.Path(__file__).parents[2]


def _one_point_per_kind(experiment):
    kinds = {}
    for point in experiment.points:
        kinds.setdefault(with_overrides(experiment.base, point).model.kind, point)
    return tuple(kinds.values())


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_configs_verdict_and_one_trained_point(name, tmp_path):
    experiment = load_file(ROOT / "experiments" / f"{name}.py").get_experiment(smoke=True)
    assert experiment.points and all(with_overrides(experiment.base, p) for p in experiment.points)
    for value in (0.0, 1.0):  # the rule reads every point's stats and returns a verdict
        stats = Stats(value, math.nan, (value,), 1e-3, 1)
        verdict, reason = experiment.verdict(Summary([(p, stats) for p in experiment.points]))
        assert verdict in VERDICTS and reason

    subset = dataclasses.replace(
        experiment, points=_one_point_per_kind(experiment), verdict=lambda s: ("inconclusive", "-")
    )
    outcome = sweep(subset, tmp_path, num_seeds=1)
    assert [p for p, _ in outcome.summary] == list(subset.points)
    assert outcome.claim_id == experiment.claim_id and (tmp_path / "summary.png").exists()
