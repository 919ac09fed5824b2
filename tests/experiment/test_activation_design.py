"""S8's redesigned rule (experiments/activation.py): every judged part reaches supported,
refuted and inconclusive on constructed per-seed rows; a refutation at a grid bound is withheld
for that part only; pairs with different best rates are judged at a common rate; the checks
pass and can fail."""

import pathlib

import numpy as np
import pytest

from attnjax.experiment import load_file
from attnjax.experiment.sweep import Stats, label

S8 = load_file(pathlib.Path(__file__).parents[2] / "experiments" / "activation.py")
SEEDS = range(S8.FIRST_SEED, S8.FIRST_SEED + S8.SEEDS)
# Per point: (init entropy, trained saturated, trained dead for every input, test accuracy).
GOOD = {
    "centred_none": (0.98, 0.0, 0.0, 0.0),
    "centred_plus": (0.97, 0.0, 0.0, 0.0),
    "relu_centred": (0.98, 0.0, 0.0, 0.0),
    "tanh_none": (0.99, 0.40, 0.3, 1.0),
    "tanh_bias": (0.99, 0.20, 0.3, 1.0),
    "relu_none": (0.99, 0.40, 0.35, 1.0),
    "relu_plus": (0.99, 0.40, 0.20, 1.0),
}
POINTS = dict(zip(GOOD, S8.POINTS, strict=True))
EDGE = dict(rates="0.0003 0.001 0.003", lr=0.0003)


def rows(changes=None, noise=0.005, rates="0.003 0.01 0.03", lr=0.01, edge=(), best=None):
    """Analysis rows for every point and seed: ``GOOD`` with ``changes`` (point: tuple),
    plus seed noise of scale ``noise`` (a fixed draw); the points in ``edge`` are judged at a
    grid bound; ``best`` (point: rate) overrides a point's own best rate."""
    values = GOOD | (changes or {})
    rng = np.random.default_rng(0)
    out = []
    for name, point in POINTS.items():
        entropy, saturated, dead, accuracy = values[name]
        grid = EDGE if name in edge else dict(rates=rates, lr=lr)
        for seed in SEEDS:
            e = rng.normal(0, noise, 4)
            out.append({"point": label(point), "seed": seed, "learning_rate": grid["lr"],
                        "best rate": (best or {}).get(name, grid["lr"]), "rates": grid["rates"],
                        "test_accuracy": accuracy + e[3],
                        "init entropy / log S": entropy + e[0], f"init {S8.SCALED}": entropy / 2,
                        "init saturated": 0.5, "init dead for every input": 0.3,
                        "trained saturated": saturated + e[1],
                        "trained dead for every input": dead + e[2]})  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("changes", "part", "expected"),
    [
        ({}, None, "supported"),
        ({"tanh_bias": (0.99, 0.39, 0.3, 1.0)}, S8.B, "refuted"),  # reduction ≈ 0.01
        ({"tanh_bias": (0.99, 0.50, 0.3, 1.0)}, S8.B, "refuted"),  # the bias raises it
        ({"tanh_bias": (0.99, 0.35, 0.3, 1.0)}, S8.B, "inconclusive"),  # reduction ≈ the effect
        ({"relu_plus": (0.99, 0.4, 0.35, 1.0)}, S8.C, "refuted"),  # +1 does not lower it
        ({"relu_plus": (0.99, 0.4, 0.2, 0.9)}, S8.C, "refuted"),  # +1 costs accuracy
        ({"relu_plus": (0.99, 0.4, 0.3, 1.0)}, S8.C, "inconclusive"),  # reduction ≈ the effect
    ],
)
def test_every_part_reaches_each_verdict(changes, part, expected):
    verdict, reason, parts = S8.judge(rows(changes))
    assert set(parts) == {S8.B, S8.C}
    if part is None:
        assert verdict == expected and set(parts.values()) == {"supported"}
    else:
        assert parts[part] == expected
        assert all(v == "supported" for k, v in parts.items() if k != part)
        assert verdict == expected
    assert "Not judged (initialization)" in reason


def test_the_init_entropy_is_not_judged():
    """Attention far from uniform at initialization changes no part and no verdict."""
    assert S8.judge(rows({"centred_none": (0.5, 0, 0, 0)}))[0] == "supported"


def test_noise_widens_a_part_into_inconclusive():
    """The same means as a supported record, but seeds spread by 0.4: no part is decided."""
    parts = S8.judge(rows(noise=0.4))[2]
    assert parts[S8.B] == parts[S8.C] == "inconclusive"


def test_a_refutation_at_its_own_grid_bound_is_withheld_but_support_is_not():
    refuted = {"tanh_bias": (0.99, 0.50, 0.3, 1.0)}
    assert S8.judge(rows(refuted, edge=("tanh_none",)))[2][S8.B] == "inconclusive"
    assert S8.judge(rows(refuted, edge=("relu_none", "relu_plus")))[2][S8.B] == "refuted"
    assert S8.judge(rows(edge=tuple(GOOD)))[0] == "supported"


def test_the_reason_says_whether_a_pairs_best_rates_agreed():
    reason = S8.judge(rows(best={"relu_plus": 0.003}))[1]
    assert "(b)" in reason and "best rates agreed" in reason
    assert "best rates differed (0.01 vs 0.003: common rate)" in reason


def test_a_pair_with_different_best_rates_is_judged_at_the_smallest_summed_loss():
    """Own bests 0.003 and 0.03; on their shared grid the sums are 1.3, 1.0 and 1.3."""
    a = Stats(
        0, 0, (), 0.003, 0, ((0.001, 0.9, 0), (0.003, 0.2, 0), (0.01, 0.3, 0), (0.03, 0.9, 0))
    )
    b = Stats(0, 0, (), 0.03, 0, ((0.003, 1.1, 0), (0.01, 0.7, 0), (0.03, 0.4, 0), (0.1, 0.8, 0)))
    assert S8.common_rate(a, b) == 0.01
    assert S8.common_rate(a, a._replace(by_learning_rate=())) == 0.003  # same best: kept


def test_a_point_missing_a_seed_raises():
    with pytest.raises(ValueError, match="seeds"):
        S8.judge(rows()[1:])


def test_the_checks_pass():
    assert all(check.test() for check in S8.CHECKS)


def test_the_record_seeds_are_not_the_pilots():
    assert not set(SEEDS) & set(S8.PILOT_SEEDS)
