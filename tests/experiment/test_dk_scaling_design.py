"""S2 (dk_scaling) redesign: the per-seed fall of test accuracy over every H, the exact
sign-flip test beside the t bounds, each part's rule on constructed summaries (supported,
refuted and inconclusive all reachable, every part and both optimizers judged, the floor guard
and the grid-edge rule), the still-climbing report, and the record's seeds disjoint from the
pilot's."""

import json
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from attnjax.experiment import Stats, Summary, grid, load_file, storage
from attnjax.experiment.stats import lower, paired_lower
from attnjax.experiment.sweep import check_pilot

ROOT = pathlib.Path(__file__).parents[2]
SOLVED, FAILED = 1.0, 0.1  # test accuracies of a solved and a failed seed
DEGRADES = [0, 3, 10, 15]  # failed seeds at each H


@pytest.fixture(scope="module")
def module():
    return load_file(ROOT / "experiments" / "dk_scaling.py")


def _summary(module, changed=None, edge=None):
    """Every point's ``SEEDS`` seeds solved unless ``changed[(optimizer, score)]`` gives the
    number of failed seeds at each H (the same first seeds fail, so seeds are paired); the
    point ``edge`` (optimizer, score, H) has its best rate at the edge of its grid."""
    axes = {"optim.optimizer": ("adamw", "sgd"), "model.score": module.TRAIN_SCORES,
            "model.head_dim": module.TRAIN_DIMS}  # fmt: skip
    entries = []
    for point in SimpleNamespace(points=grid(**axes)).points:
        key = point["optim.optimizer"], point["model.score"]
        fails = (changed or {}).get(key, [0] * len(module.TRAIN_DIMS))
        n = fails[module.TRAIN_DIMS.index(point["model.head_dim"])]
        values = (FAILED,) * n + (SOLVED,) * (module.SEEDS - n)
        best, rates = 1e-2, ((1e-3, 0.5, 0.5), (1e-2, 0.9, 0.9), (1e-1, 0.4, 0.4))
        if (*key, point["model.head_dim"]) == edge:  # the best rate is the largest
            best, rates = 1e-1, ((1e-3, 0.5, 0.5), (1e-2, 0.4, 0.4), (1e-1, 0.9, 0.9))
        entries.append((point, Stats(float(np.mean(values)), 0.0, values, best, 1, rates)))
    return Summary(entries)


def _verdict(module, edge=None, **changed):
    changed = {tuple(k.split("_", 1)): v for k, v in changed.items()}
    return module.verdict(_summary(module, changed, edge))


def test_fall_is_the_fitted_fall_in_accuracy_over_every_h(module):
    summary = _summary(module, {("adamw", "dot"): [0, 0, 8, 16]})
    d = module.drops(summary, "adamw", "dot")
    # seeds 0-7 fall by 0.9 at H 64 and 256: 0.9 · (0.3 + 0.9); seeds 8-15 only at 256
    assert np.allclose(d, [0.9 * 1.2] * 8 + [0.9 * 0.9] * 8)
    assert np.allclose(module.drops(summary, "adamw", "additive"), 0.0)


def test_sign_flip_test_blocks_what_the_t_bound_would_pass_on_few_seeds(module):
    four, five = ([0.9] * k + [0.0] * (16 - k) for k in (4, 5))
    assert lower(four) > 0 and np.mean(four) >= module.EFFECT  # the t bound alone would pass
    assert module.flip_p(four) == pytest.approx(1 / 16)
    assert module.trend(np.array(four)) == "unclear"
    assert module.trend(np.array(five)) == "falls"
    scaled, dot = [1.0] * 16, [0.1] * 3 + [1.0] * 13  # better on 3 seeds of 16
    assert paired_lower(scaled, dot) > 0 and module.flip_p(np.subtract(scaled, dot)) >= 0.05


def test_every_verdict_is_reachable_and_every_part_is_judged(module):
    both = {"adamw_dot": DEGRADES, "sgd_dot": DEGRADES}
    verdict, reason = _verdict(module, **both)
    assert verdict == "supported" and reason.startswith("Within 400 steps.")
    assert "Adam alone: supported" in reason
    assert _verdict(module)[0] == "refuted"  # dot does not degrade (never fails)
    assert _verdict(module, adamw_dot=DEGRADES)[0] == "refuted"  # each optimizer is judged
    assert _verdict(module, **both, sgd_additive=DEGRADES)[0] == "refuted"  # additive judged
    assert _verdict(module, **both, adamw_scaled_dot=DEGRADES)[0] == "refuted"  # scaling judged
    # 4 of 16 seeds fall: the sign-flip p is 1/16, neither a fall nor flat
    assert _verdict(module, **both, adamw_additive=[0, 2, 3, 4])[0] == "inconclusive"
    assert _verdict(module, adamw_dot=[0, 1, 2, 3], sgd_dot=DEGRADES)[0] == "inconclusive"


def test_a_score_that_never_learns_is_not_flat(module):
    both = {"adamw_dot": DEGRADES, "sgd_dot": DEGRADES}
    verdict, reason = _verdict(module, **both, adamw_additive=[16] * 4)
    assert verdict == "inconclusive" and "no room" in reason
    assert _verdict(module, **both, adamw_scaled_dot=[15] * 4)[0] == "inconclusive"
    # dot that never learns is not refuted as flat
    assert _verdict(module, adamw_dot=[16] * 4, sgd_dot=DEGRADES)[0] == "inconclusive"


def test_a_best_rate_at_a_grid_edge_leaves_its_part_inconclusive(module):
    both = {"adamw_dot": DEGRADES, "sgd_dot": DEGRADES}
    verdict, reason = _verdict(module, edge=("sgd", "additive", 4), **both)
    assert verdict == "inconclusive" and "grid edge: additive H 4" in reason
    assert _verdict(module, edge=("sgd", "dot", 256), **both)[0] == "inconclusive"


def test_still_climbing_counts_failing_runs_that_rose_in_the_last_interval(module, tmp_path):
    point = {"point": "dot", "model.score": "dot"}
    rows = [point | {"seed": s, "learning_rate": 0.1, "chosen": True, "test_accuracy": a}
            for s, a in ((0, 0.5), (1, 0.6), (2, 1.0))]  # fmt: skip
    storage.write_csv(tmp_path / "results.csv", rows)
    folder = tmp_path / "points" / "00_dot"
    folder.mkdir(parents=True)
    storage.write_csv(folder / "results.csv", rows)
    log = [{"seed": s, "learning_rate": 0.1, "step": step, "split": "valid",
            "metric": "accuracy", "value": v}
           for s, values in ((0, (0.3, 0.4, 0.5)), (1, (0.3, 0.6, 0.62)), (2, (0.5, 0.8, 1.0)))
           for step, v in zip((100, 200, 300), values, strict=True)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    assert module.still_climbing(tmp_path) == {"dot": (1, 2)}


def test_record_seeds_are_fresh_and_checks_hold(module):
    experiment = module.get_experiment(smoke=True)
    check_pilot(experiment, module.SEEDS)  # raises if a record seed was a pilot's
    assert experiment.metric == "accuracy" and experiment.solved_at == module.SOLVED
    assert all(check.test() for check in experiment.checks)
    assert len(experiment.parts) == 3 * 2
