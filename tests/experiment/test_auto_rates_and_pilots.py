"""A learning-rate grid that grows until every point's best rate is interior (a fake trainer
stands in for training: each rate's accuracy falls with its distance from the point's best
rate), and pilot seeds a published record may not reuse."""

import dataclasses
import importlib
import math

import pytest

from attnjax.experiment import Experiment, rates, with_overrides
from attnjax.experiment.rates import AutoRates
from attnjax.experiment.recompute import Differs, expected_report
from attnjax.experiment.record import read_rows
from attnjax.experiment.storage import write_csv
from attnjax.experiment.sweep import check_pilot, seeds, summarize, sweep_report
from tests.experiment.test_cli import TINY, _refused

sweep_module = importlib.import_module("attnjax.experiment.sweep")  # the package's `sweep` is
# the function

PEAKS = {1: 3e-3, 2: 1.0}  # heads → the rate a fake run does best at
AUTO = AutoRates((1e-3, 3e-3, 1e-2), factor=3.0, bounds=(1e-4, 0.1))


def _fake_train(config, workdir, *, num_seeds, learning_rates, fields, **_):
    """One row per seed and rate, as ``train_and_evaluate`` returns them: accuracy 0.99 at the
    point's peak rate, less by 0.1 per decade away (plus a seed's 0.001)."""
    peak = PEAKS[fields["model.heads"]]
    rows = []
    for lr in learning_rates:
        for seed in range(num_seeds):
            value = 0.99 - 0.1 * abs(math.log10(lr / peak)) + 0.001 * seed
            rows.append(fields | {"seed": seed, "learning_rate": lr, "params": 7,
                                  "flops_per_step": 1, "valid_accuracy": value,
                                  "test_accuracy": value})  # fmt: skip
    return rows


def test_auto_rates_extend_a_grid_until_its_best_rate_is_interior_or_bounded(
    smoke_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(sweep_module, "train_and_evaluate", _fake_train)
    experiment = Experiment(
        "auto", "X1", "c", smoke_config, ({"model.heads": 1}, {"model.heads": 2}), "accuracy",
        lambda s: ("inconclusive", "r"), learning_rates=AUTO,
    )  # fmt: skip
    outcome = sweep_module.sweep(experiment, tmp_path, num_seeds=2, workers=1)
    one, two = (s for _, s in outcome.summary)
    assert [lr for lr, _, _ in one.by_learning_rate] == [1e-3, 3e-3, 1e-2]  # interior at once
    assert not one.at_edge and one.learning_rate == 3e-3
    # heads=2 peaks at 1.0: 0.03 and 0.09 are added; 0.27 would leave the bound 0.1
    assert [lr for lr, _, _ in two.by_learning_rate] == [1e-3, 3e-3, 1e-2, 0.03, 0.09]
    assert two.learning_rate == 0.09 and two.at_edge
    assert "Rates added: heads=2: 0.03, 0.09." in outcome.body
    assert "every grid starts at [0.001, 0.003, 0.01]" in outcome.body
    rows = read_rows(tmp_path / "results.csv")  # the record recomputes the same report
    summary = summarize(experiment, rows)[0]
    assert sweep_report(experiment, summary, "inconclusive", "r", 2) == outcome.body


def test_auto_rates_step_down_round_and_refuse_bad_grids():
    assert AUTO.next_rate([1e-3, 3e-3, 1e-2], 1e-3) == 0.000333
    assert AUTO.next_rate([0.000333, 1e-3, 3e-3], 0.000333) == 0.000111
    assert AUTO.next_rate([0.000111, 1e-3], 0.000111) is None  # 3.7e-5 is below the bound
    assert AUTO.next_rate([1e-3, 3e-3, 1e-2], 3e-3) is None
    assert AUTO.added([1e-3, 3e-3, 1e-2, 0.03]) == (0.03,)
    with pytest.raises(ValueError, match="factor"):
        AutoRates((1e-3, 1e-2), factor=1.0)
    with pytest.raises(ValueError, match="two or more"):
        AutoRates((1e-3,))


def test_learning_rates_auto_names_the_default_growing_grid(smoke_config):
    def make(rates):
        return Experiment("a", "X1", "c", smoke_config, ({"model.heads": 1},), "accuracy",
                          lambda s: ("inconclusive", ""), learning_rates=rates)  # fmt: skip

    assert make("auto").learning_rates == rates.AUTO
    assert make("auto").rates({"model.heads": 1}) == (1e-3, 3e-3, 1e-2)
    with pytest.raises(ValueError, match="the one named grid is 'auto'"):
        make("grid")


def test_a_record_may_not_train_its_pilot_seeds(smoke_config):
    experiment = Experiment(
        "p", "X1", "c", smoke_config, ({"model.heads": 1},), "accuracy",
        lambda s: ("inconclusive", ""), pilot_seeds=(0, 1, 2),
    )  # fmt: skip
    assert seeds(experiment, 5) == (0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"pilot seeds \[0, 1, 2\]"):
        check_pilot(experiment, 5)
    fresh = dataclasses.replace(experiment, base=with_overrides(smoke_config, {"train.seed": 3}))
    check_pilot(fresh, 5)  # seeds 3..7
    assert seeds(fresh, 5) == (3, 4, 5, 6, 7)
    body = sweep_report(fresh, summarize_one(fresh), "inconclusive", "", 5)
    assert "Record seeds [3, 4, 5, 6, 7]; pilot seeds [0, 1, 2]" in body


def summarize_one(experiment):
    rows = [{"point": "heads=1", "seed": s, "learning_rate": 1e-3, "params": 1,
             "valid_accuracy": 0.5, "test_accuracy": 0.5} for s in (3, 4)]  # fmt: skip
    return summarize(experiment, rows)[0]


def test_sweep_refuses_to_publish_a_record_on_pilot_seeds_before_training(tmp_path, capsys):
    path = tmp_path / "experiments" / "tiny.py"
    path.parent.mkdir()
    path.write_text(TINY.replace("metric='accuracy',", "metric='accuracy', pilot_seeds=(1,),"))
    out = tmp_path / "out"
    command = ["sweep", str(path), "--publish", "--seeds", "2", "--out", str(out)]
    err = _refused(capsys, command)
    assert "would train its pilot seeds [1]" in err and "--set train.seed=" in err
    assert not out.exists() and not (tmp_path / "results").exists()


def test_a_committed_record_on_its_pilot_seeds_fails_the_check(tmp_path):
    path = tmp_path / "experiments" / "tiny.py"
    path.parent.mkdir()
    path.write_text(TINY.replace("metric='accuracy',", "metric='accuracy', pilot_seeds=(1,),"))
    folder = tmp_path / "results" / "tiny"
    folder.mkdir(parents=True)
    write_csv(folder / "results.csv", [{"point": "heads=1", "seed": s} for s in (0, 1)])
    with pytest.raises(Differs, match=r"trained on the pilot seeds \[1\]"):
        expected_report(folder, path)
