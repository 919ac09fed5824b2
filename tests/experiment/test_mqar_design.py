"""mqar (E6) design: the exact position-only limit against a brute-force enumeration and the
task's own draws, each part of the rule reaching supported, refuted and inconclusive on
constructed summaries, and the points' seeds."""

import itertools
import math
import pathlib

import jax
import numpy as np

from attnjax import tasks
from attnjax.experiment import Stats, Summary, load_file

ROOT = pathlib.Path(__file__).parents[2]
MODULE = load_file(ROOT / "experiments" / "mqar.py")
SEEDS = 5
MIDDLE = [0.60, 0.65, 0.55, 0.62, 0.58]  # (c): room above the floor (0.12) and below 0.95


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


def monte_carlo_position_limit(seq_len, num_pairs, vocab_size, examples):
    """``(limit, standard error)`` of the position-only predictor over ``examples`` drawn by
    the task itself: per position, the key index most often queried there."""
    task = tasks.get("mqar")
    config = task.config(vocab_size=vocab_size, seq_len=seq_len, num_pairs=num_pairs)
    batch = task.generate(jax.random.key(0), examples, config)
    inputs, mask = np.asarray(batch["inputs"]), np.asarray(batch["loss_mask"])
    rows, positions = np.nonzero(mask)  # every query: its example and position
    keys = inputs[:, : 2 * num_pairs : 2]  # [B, P], the context's keys in order
    index = np.argmax(keys[rows] == inputs[rows, positions][:, None], axis=1)
    counts = np.zeros((seq_len, num_pairs))
    np.add.at(counts, (positions, index), 1)
    limit = counts.max(axis=1).sum() / len(rows)
    return limit, math.sqrt(limit * (1 - limit) / len(rows))


def test_position_limit_matches_enumeration_and_the_generator():
    exact = exact_position_limit(32, 4, 0.01)
    assert math.isclose(MODULE.position_limit(32, 4, 0.01), exact, rel_tol=1e-12)
    assert exact > 1 / 4 + 0.04  # the task's power-law slots: the bar is not 1/num_pairs
    assert math.isclose(MODULE.position_limit(16, 2, 1.0), 1 / 2)  # uniform slots: 1/num_pairs
    assert math.isclose(exact_position_limit(16, 2, 1.0), 1 / 2)
    limit, error = monte_carlo_position_limit(32, 4, 64, examples=50_000)
    assert abs(MODULE.task_limit(32, 4, 64) - limit) < 4 * error
    assert 0.115 < MODULE.task_limit(64, 16, 64) < 0.125  # (c)'s floor: every slot filled


def _stats(values, edge=False):
    rates = ((1e-4, 0.9, 0.9), (3e-4, 0.5, 0.5), (1e-3, 0.4, 0.4))
    mean = sum(values) / len(values)
    return Stats(mean, math.nan, tuple(values), 1e-4 if edge else 3e-4, 1, rates)


def _name(point: dict) -> str:
    hard = "hard" if "task.seq_len" in point else ""
    return hard + ("one", "two")[point["model.layers"] - 1] + str(point["model.width"])


def _verdict(**given):
    """The rule on every point at a default that supports its part unless ``given`` (name →
    Stats; names ``one64``, ``two64``, ``hardtwo64``, ``hardtwo128``)."""
    exp = MODULE.get_experiment(smoke=True)
    defaults = {"one64": [0.25] * SEEDS, "two64": [0.999, 0.998, 0.999, 0.997, 0.998]}
    entries = [(p, given.get(_name(p), _stats(defaults.get(_name(p), MIDDLE))))
               for p in exp.points]  # fmt: skip
    return exp.verdict(Summary(entries))[0]


def test_every_part_reaches_each_verdict():
    assert _verdict() == "supported"
    # (a) two layers solve at width 64: the one-sided bounds, not the mean
    assert _verdict(two64=_stats([0.99, 0.995, 0.985, 0.998, 0.994])) == "inconclusive"
    assert _verdict(two64=_stats([0.97, 0.975, 0.98, 0.97, 0.972])) == "refuted"
    assert _verdict(two64=_stats([0.999] * 4 + [0.998], edge=True)) == "inconclusive"
    # (b) one layer at most the position-only limit (about 0.307), whatever its rate
    assert _verdict(one64=_stats([0.5, 0.55, 0.45, 0.5, 0.52])) == "refuted"
    assert _verdict(one64=_stats([0.30, 0.25, 0.32, 0.27, 0.31])) == "inconclusive"
    assert _verdict(one64=_stats([0.25] * SEEDS, edge=True)) == "supported"
    # (c) flat below the ceiling, paired by seed, ±0.05: refuted either way, the edge only at
    # the width behind
    ahead = _stats([0.70, 0.76, 0.66, 0.72, 0.69])
    assert _verdict(hardtwo128=ahead) == "refuted"
    assert _verdict(hardtwo128=ahead._replace(learning_rate=1e-4)) == "refuted"
    assert _verdict(hardtwo128=ahead, hardtwo64=_stats(MIDDLE, edge=True)) == "inconclusive"
    assert _verdict(hardtwo128=_stats([0.50, 0.56, 0.47, 0.52, 0.49])) == "refuted"
    assert _verdict(hardtwo128=_stats([0.63, 0.62, 0.60, 0.61, 0.64])) == "inconclusive"
    assert _verdict(hardtwo128=_stats(MIDDLE, edge=True)) == "inconclusive"
    # near the ceiling a 0.05 difference cannot arise upward: not supported
    near = {"hardtwo64": _stats([0.96, 0.97, 0.95, 0.96, 0.97]), "hardtwo128": _stats([0.999] * 5)}
    assert _verdict(**near) == "inconclusive"
    # apart from the floor or the ceiling: refuted, not hidden by the gate
    assert (
        _verdict(hardtwo64=_stats([0.12] * 5), hardtwo128=_stats([0.8, 0.85, 0.75, 0.82, 0.78]))
        == "refuted"
    )
    assert _verdict(hardtwo64=_stats([0.999] * 5), hardtwo128=_stats([0.5] * 5)) == "refuted"
    for level in (0.999, 0.1):  # equal at the ceiling or the floor: not tested
        assert (
            _verdict(**{f"hardtwo{w}": _stats([level] * 5) for w in MODULE.WIDTHS})
            == "inconclusive"
        )


def test_points_share_seeds_disjoint_from_the_pilot():
    exp = MODULE.get_experiment(smoke=True)
    assert exp.points[:2] == (MODULE.one_layer(64), MODULE.two_layers(64))
    assert exp.points[2:] == (MODULE.hard(64), MODULE.hard(128))
    assert {(p["task.num_pairs"], p["train.eval_batch_size"]) for p in exp.points[2:]} == {
        (16, 512)
    }
    assert exp.base.train.seed == MODULE.FIRST_SEED
    assert not set(MODULE.PILOT_SEEDS) & set(range(MODULE.FIRST_SEED, MODULE.FIRST_SEED + 20))
