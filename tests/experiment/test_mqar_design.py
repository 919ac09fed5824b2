"""mqar (E6) design: the position-only limit against an exact enumeration, and each part of
the rule reaching supported, refuted and inconclusive on constructed summaries."""

import itertools
import math
import pathlib

import numpy as np

from attnjax.experiment import Stats, Summary, load_file

ROOT = pathlib.Path(__file__).parents[2]
MODULE = load_file(ROOT / "experiments" / "mqar.py")
SEEDS = 5


def exact_position_limit(seq_len: int, num_pairs: int, power_a: float) -> float:
    """The position-only predictor's accuracy, exactly: query slots are drawn one key at a
    time without replacement with weights ∝ (g + 1)^(power_a − 1) (the task's law; JAX's
    weighted choice without replacement is this sequential draw), so enumerate every ordered
    draw and take, per slot, the likeliest key index."""
    space = (seq_len - 2 * num_pairs) // 2
    weights = np.arange(1, space + 1) ** (power_a - 1.0)
    at = np.zeros((space, num_pairs))  # P(slot g holds key index i)
    for draw in itertools.permutations(range(space), num_pairs):
        p, left = 1.0, weights.sum()
        for g in draw:
            p *= weights[g] / left
            left -= weights[g]
        for i, g in enumerate(draw):
            at[g, i] += p
    return float(at.max(axis=1).sum() / num_pairs)


def test_position_only_limit_matches_exact_enumeration():
    limit, error = MODULE.position_only(32, 4, 64)
    exact = exact_position_limit(32, 4, 0.01)
    assert abs(limit - exact) < 4 * error
    assert exact > 1 / 4 + 0.04  # the task's power-law slots: the bar is not 1/num_pairs
    assert math.isclose(exact_position_limit(16, 2, 1.0), 1 / 2)  # uniform slots: 1/num_pairs


def _stats(values, edge=False):
    rates = ((1e-4, 0.9, 0.9), (3e-4, 0.5, 0.5), (1e-3, 0.4, 0.4))
    mean = sum(values) / len(values)
    return Stats(mean, math.nan, tuple(values), 1e-4 if edge else 3e-4, 1, rates)


def _verdict(**given):
    """The rule on every point at a default that supports its part unless ``given`` (name →
    Stats; names ``two64``, ``two128``, ``one64``)."""
    exp = MODULE.get_experiment(smoke=True)
    defaults = {1: [0.25] * SEEDS, 2: [0.999, 0.998, 0.999, 0.997, 0.998]}
    entries = []
    for p in exp.points:
        name = ("one", "two")[p["model.layers"] - 1] + str(p["model.width"])
        entries.append((p, given.get(name, _stats(defaults[p["model.layers"]]))))
    return exp.verdict(Summary(entries))[0]


def test_every_part_reaches_each_verdict():
    assert _verdict() == "supported"
    # (a) two layers solve at width 64 and (c) at width 128: the one-sided bounds, not the mean
    for name in ("two64", "two128"):
        assert _verdict(**{name: _stats([0.99, 0.995, 0.985, 0.998, 0.994])}) == "inconclusive"
        assert _verdict(**{name: _stats([0.97, 0.975, 0.98, 0.97, 0.972])}) == "refuted"
        assert _verdict(**{name: _stats([0.999] * 4 + [0.998], edge=True)}) == "inconclusive"
    # (b) one layer at most the position-only limit (about 0.307), whatever its rate
    assert _verdict(one64=_stats([0.5, 0.55, 0.45, 0.5, 0.52])) == "refuted"
    assert _verdict(one64=_stats([0.30, 0.25, 0.32, 0.27, 0.31])) == "inconclusive"
    assert _verdict(one64=_stats([0.25] * SEEDS, edge=True)) == "supported"


def test_points_share_seeds_disjoint_from_the_pilot():
    exp = MODULE.get_experiment(smoke=True)
    assert exp.points == (MODULE.one_layer(64), MODULE.two_layers(64), MODULE.two_layers(128))
    assert exp.base.train.seed == MODULE.FIRST_SEED
    assert not set(MODULE.PILOT_SEEDS) & set(range(MODULE.FIRST_SEED, MODULE.FIRST_SEED + 20))
