"""Verdict rules of the redesigned experiments on constructed summaries whose points differ:
each rule can come out supported, refuted and inconclusive, and judges every part."""

import math
import pathlib

from attnjax.experiment import Stats, Summary, load_file, with_overrides

ROOT = pathlib.Path(__file__).parents[2]


def _load(name):
    return load_file(ROOT / "experiments" / f"{name}.py")


def _summary(experiment, values, default):
    """Each point's seeds: ``values[i]`` for the listed points, else ``default``."""
    entries = []
    for point in experiment.points:
        seeds = next((v for p, v in values if p == point), default)
        mean = sum(seeds) / len(seeds)
        spread = max(seeds) - min(seeds)
        entries.append((point, Stats(mean, spread / 2, tuple(seeds), 1e-3, 1)))
    return Summary(entries)


def test_xor_bits_can_by_construction_does_by_training_per_rate(monkeypatch):
    module = _load("xor_bits")
    assert math.isclose(module.single_head_cap(), 0.75)
    exp = module.get_experiment(smoke=True)
    at_cap, solved, lost = [0.75] * 5, [1.0] * 5, [0.75, 0.5, 0.75, 0.5, 0.75]

    def verdict(one_head=None, **models):
        """Every rate of each model at ``solved`` (one head: ``at_cap``) unless a list of
        per-rate seed values is given."""
        values = []
        for name, default in [("ONE_HEAD", at_cap), ("TWO_HEADS", solved), ("WITH_MLP", solved),
                              ("WITH_LAYERNORM", solved)]:  # fmt: skip
            given = one_head if name == "ONE_HEAD" else models.get(name)
            per_rate = given or [default] * len(module.RATES)
            values += list(zip(module._rated(getattr(module, name)), per_rate, strict=True))
        return exp.verdict(_summary(exp, values, at_cap))

    five = len(module.RATES)
    assert verdict()[0] == "supported"
    # a does part: supported at some rate with 3 of 5 seeds, refuted only at 0 of 5 everywhere
    three = [[1.0, 1.0, 1.0, 0.75, 0.75]] + [lost] * (five - 1)
    assert verdict(WITH_LAYERNORM=three)[0] == "supported"
    two = [[1.0, 1.0, 0.75, 0.75, 0.75]] + [lost] * (five - 1)
    assert verdict(WITH_LAYERNORM=two)[0] == "inconclusive"
    found, reason = verdict(WITH_LAYERNORM=[lost] * five)
    assert found == "refuted" and "1 head + LayerNorm ✗" in reason and "can: 3/3" in reason
    assert verdict(TWO_HEADS=[lost] * five)[0] == "refuted"
    # training reaches the cap: all five seeds at some rate; none anywhere refutes it
    assert verdict(one_head=[lost] * (five - 1) + [at_cap])[0] == "supported"
    assert verdict(one_head=[[0.75] * 4 + [0.5]] * five)[0] == "inconclusive"
    assert verdict(one_head=[[0.5] * 5] * five)[0] == "refuted"
    # a run above the cap is a bug, reported, not counted
    found, reason = verdict(one_head=[[0.75] * 4 + [1.0]] + [at_cap] * (five - 1))
    assert found == "supported" and "1 trained 1-head runs above 3/4 (a BUG" in reason
    # a can part rests on its witness: training never refutes it; only an impossibility does
    name = "1 head + LayerNorm"
    monkeypatch.setitem(module.CAN_RULES, name, module.can_part(name, lambda: 0.0))
    assert verdict()[0] == "inconclusive"
    impossible = module.can_part(name, lambda: 0.0, impossible=lambda: True)
    monkeypatch.setitem(module.CAN_RULES, name, impossible)
    assert verdict()[0] == "refuted"


def test_dk_scaling_measures_unscaled_logit_variance_near_h():
    module = _load("dk_scaling")
    base = load_file(ROOT / "configs" / "dk_scaling.py").get_config("smoke")
    for score, expected in [("dot", 64), ("scaled_dot", 1)]:
        config = with_overrides(base, {"model.score": score, "model.head_dim": 64})
        assert 0.67 < module.model_init_variance(config) / expected < 1.5
