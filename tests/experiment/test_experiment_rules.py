"""Verdict rules of the redesigned experiments on constructed summaries whose points differ:
each rule can come out supported, refuted and inconclusive, and judges every part."""

import math
import pathlib

from attnjax.experiment import Stats, Summary, load_file

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


def test_xor_bits_cap_is_three_quarters_and_every_part_is_judged():
    module = _load("xor_bits")
    assert math.isclose(module.single_head_cap(), 0.75)
    exp = module.get_experiment(smoke=True)
    one, solved = module.ONE_HEAD, [1.0] * 5

    def verdict(one_head, **others):
        values = [(one, one_head)] + [(getattr(module, k), v) for k, v in others.items()]
        return exp.verdict(_summary(exp, values, solved))[0]

    assert verdict([0.75] * 5) == "supported"
    assert verdict([0.75] * 4 + [1.0]) == "refuted"  # one seed beats the cap
    assert verdict([0.75] * 5, WITH_LAYERNORM=[0.75] * 5) == "refuted"  # LN part judged
    assert verdict([0.75] * 5, TWO_HEADS=[1.0, 1.0, 0.75, 0.75, 0.75]) == "inconclusive"


def test_min_of_keys_needs_the_control_to_refute_two_heads():
    module = _load("min_of_keys")
    exp = module.get_experiment(smoke=True)
    low, high = [0.79] * 5, [0.97] * 5

    def verdict(two_heads, control, one_head=low):
        values = [(module.TWO_HEADS_MLP, two_heads), (module.TWO_LAYERS, control)]
        values += [(module.DOT | {"model.heads": 1, "model.mlp": m}, one_head) for m in module.MLP]
        return exp.verdict(_summary(exp, values, low))[0]

    assert verdict(high, high) == "supported"
    assert verdict(low, high) == "refuted"
    assert verdict(low, low) == "inconclusive"  # nothing learned it: no conclusion
    assert verdict(high, high, one_head=high) == "refuted"
