"""min_of_keys (E3) design: limits counted for the metric scored, the rule's reachable
outcomes per part on constructed summaries, the hard-selection checks and the witness."""

import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from attnjax import tasks
from attnjax.experiment import Stats, Summary, load_file

ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture(scope="module")
def module():
    return load_file(ROOT / "experiments" / "min_of_keys.py")


def _summary(module, values):
    """Seeds per point: ``values[name]`` for the named points (module constants), else 0.8."""
    entries = []
    for point in module.get_experiment(smoke=True).points:
        seeds = next((v for k, v in values.items() if getattr(module, k) == point), [0.8] * 8)
        entries.append((point, Stats(float(np.mean(seeds)), 0.0, tuple(seeds), 1e-3, 1)))
    return Summary(entries)


def _noisy(mean, sd=0.01, n=8):
    return list(mean + sd * np.linspace(-1.5, 1.5, n))


def test_limits_are_counted_by_value(module):
    """With values drawn with replacement a wrong key carries the right value 1/num_values of
    the time (the first record's 0.786 vs ≈ 0.813); with distinct values, by value = by key."""
    iid = tasks.get("min_of_keys").config(num_keys=8, num_values=8)
    key_level = iid.spec.baselines["single_direction_accuracy"]
    by_value = iid.spec.baselines["single_direction_value_accuracy"]
    assert by_value == pytest.approx(key_level + (1 - key_level) / 8)
    rng = np.random.default_rng(7)
    keys, values = rng.random((20_000, 8, 2)), rng.integers(0, 8, (20_000, 8))
    rows = np.arange(len(keys))
    picked = values[rows, keys.sum(-1).argmax(-1)] == values[rows, keys.min(-1).argmax(-1)]
    assert abs(picked.mean() - by_value) < 4 * np.sqrt(by_value * (1 - by_value) / len(keys))
    distinct = module.get_experiment().base.task
    assert distinct.distinct_values and module.limit()[0] == pytest.approx(key_level)
    assert module.ceiling()[0] == distinct.spec.baselines["two_direction_accuracy"]
    assert module.limit()[1] < 0.002 and module.ceiling()[1] < 0.002


def test_hard_selection_checks_hold(module):
    assert module.best_direction_is_the_sum(samples=4000, angles=72)
    assert module.hard_selection_below_solved()


def test_one_head_part_reaches_each_outcome(module):
    bar = module.limit()[0] + module.MARGIN
    at_limit = _noisy(module.limit()[0])
    judge = module.one_head_part
    assert judge(_summary(module, {"ONE_HEAD": at_limit, "ONE_HEAD_MLP": at_limit}))[0] == (
        "supported"
    )
    above = _noisy(bar + 0.03)
    assert judge(_summary(module, {"ONE_HEAD": at_limit, "ONE_HEAD_MLP": above}))[0] == ("refuted")
    assert judge(_summary(module, {"ONE_HEAD": _noisy(bar), "ONE_HEAD_MLP": at_limit}))[0] == (
        "inconclusive"
    )
    short = _noisy(module.limit()[0] - 0.08)  # not trained to the limit: no conclusion
    assert judge(_summary(module, {"ONE_HEAD": short, "ONE_HEAD_MLP": at_limit}))[0] == (
        "inconclusive"
    )


def test_trained_part_needs_the_control_above_the_ceiling_to_refute(module):
    q = module.ceiling()[0]
    low, solved = _noisy(q - 0.05), _noisy(0.97)
    judge = module.trained_part
    assert judge(_summary(module, {"TWO_HEADS_MLP": solved, "TWO_LAYERS": low}))[0] == "supported"
    assert judge(_summary(module, {"TWO_HEADS_MLP": low, "TWO_LAYERS": solved}))[0] == "refuted"
    assert judge(_summary(module, {"TWO_HEADS_MLP": low, "TWO_LAYERS": low}))[0] == "inconclusive"
    between = _noisy((q + module.SOLVED) / 2)  # above two hard selections, short of solved
    assert judge(_summary(module, {"TWO_HEADS_MLP": between, "TWO_LAYERS": solved}))[0] == (
        "inconclusive"
    )
    short = _noisy(module.limit()[0] - 0.08)  # one-layer attention below one ranking
    found, reason = judge(_summary(module, {"TWO_HEADS_MLP": short, "TWO_LAYERS": solved}))
    assert found == "inconclusive" and "under-trained: below one ranking" in reason


def test_claim_verdict_reaches_supported_and_refuted(module, monkeypatch):
    found = {"accuracy": 0.99, "accepted": True, "iid_values": 0.43}
    monkeypatch.setattr(module, "acceptance", lambda: found)
    at_limit, solved = _noisy(module.limit()[0]), _noisy(0.97)
    good = {"ONE_HEAD": at_limit, "ONE_HEAD_MLP": at_limit, "TWO_HEADS_MLP": solved,
            "TWO_LAYERS": solved}  # fmt: skip
    assert module.verdict(_summary(module, good))[0] == "supported"
    untrained = good | {"TWO_HEADS_MLP": at_limit}  # part 3 refuted: reported, not combined
    assert module.trained_part(_summary(module, untrained))[0] == "refuted"
    claim, reason = module.verdict(_summary(module, untrained))
    assert claim == "supported" and "(3, does, reported, not combined)" in reason
    above = _noisy(module.limit()[0] + module.MARGIN + 0.03)
    assert module.verdict(_summary(module, good | {"ONE_HEAD": above}))[0] == "refuted"
    found["accepted"] = False  # no witness: the can part is open
    assert module.can_part(_summary(module, good))[0] == "inconclusive"
    assert module.verdict(_summary(module, good))[0] == "inconclusive"


def test_witness_selects_the_maximizer(module):
    """The hand-set two heads + MLP on 2048 fresh examples (the acceptance criteria, with their
    perturbations and 2^15 examples, run in the record's report)."""
    model = module.witness_model()
    batch = module._batch(jax.random.key(3), 2048)
    assert module._accuracy(model, batch) >= 0.97
    iid = tasks.get("min_of_keys").config(num_keys=8, num_values=8)  # value tags collide
    assert module._accuracy(model, module._batch(jax.random.key(3), 2048, iid)) < 0.6
    largest = max(float(np.abs(x).max()) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert largest <= module.MAX_PARAM


def test_distinct_values_never_repeat_and_need_enough_classes():
    task = tasks.get("min_of_keys")
    config = task.config(num_keys=5, num_values=7, distinct_values=True)
    inputs = np.asarray(task.generate(jax.random.key(0), 64, config)["inputs"])
    values = inputs[:, :5, 3:].argmax(-1)
    assert all(len(set(row)) == 5 for row in values.tolist())
    with pytest.raises(ValueError, match="num_values"):
        task.config(num_keys=8, num_values=7, distinct_values=True)
