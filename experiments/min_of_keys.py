"""CLAIMS E3: one dot-product head with a fixed query ranks keys by a linear function, so it
cannot select the key maximizing min(k1, k2); the seed text says two heads plus a
feed-forward layer can. The yardstick is not chance but the best single linear ranking,
k1 + k2, which already picks the right key in about 79% of examples. Two heads that each pick
their top key reach at most about 84% even with a perfect choice between them (the best pair of
linear rankings, computed by the task), so "two heads + FFN" is expected to fail by structure.
The control that should succeed computes min(k1, k2) *before* attention ranks the keys: two
layers, the first layer's MLP acting on each key token."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, combine, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "min_of_keys.py"
MLP = [False, True]
MARGIN = 0.03
SOLVED = 0.95  # "selects the maximizer"
DOT = {"model.score": "scaled_dot"}
TWO_HEADS_MLP = DOT | {"model.heads": 2, "model.mlp": True}
ADDITIVE = {"model.score": "additive", "model.heads": 1, "model.mlp": False}
TWO_LAYERS = DOT | {"model.heads": 1, "model.mlp": True, "model.layers": 2}


def verdict(summary: Summary, limit: float, ceiling: float) -> tuple[str, str]:
    """Two parts, on 95% intervals. (1) One dot head (with or without MLP) cannot beat the
    linear limit ``L``: supported iff both stay at or below ``L + MARGIN`` (upper end), refuted
    iff either exceeds it (lower end). (2) Two dot heads + MLP can select the maximizer:
    supported iff they reach ``SOLVED`` (lower end); refuted iff they stay below it (upper end)
    while the two-layer control reaches it (lower end), so the task is learnable at this scale
    and the failure is the architecture's; else inconclusive. The claim is supported iff both
    parts are, refuted iff either is."""
    bar = limit + MARGIN
    one_dot = [summary[DOT | {"model.heads": 1, "model.mlp": mlp}] for mlp in (False, True)]
    two, control = summary[TWO_HEADS_MLP], summary[TWO_LAYERS]
    if any(s.lower > bar for s in one_dot):
        first = "refuted"
    else:
        first = "supported" if all(s.upper <= bar for s in one_dot) else "inconclusive"
    if two.lower >= SOLVED:
        second = "supported"
    else:
        failed = two.upper < SOLVED and control.lower >= SOLVED
        second = "refuted" if failed else "inconclusive"
    detail = (
        f"(1) 1 dot head best {max(s.mean for s in one_dot):.3f} vs linear limit {limit:.3f} "
        f"+ {MARGIN} ({first}); (2) 2 dot heads + MLP {two.mean:.3f} ± {two.half_width:.3f} "
        f"vs {SOLVED} ({second}), their structural ceiling with hard selection {ceiling:.3f}; "
        f"control, 2 layers + MLP: {control.mean:.3f} ± {control.half_width:.3f}; "
        f"1 additive head {summary[ADDITIVE].mean:.3f}."
    )
    return combine((first, second)), detail


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    baselines = base.task.spec.baselines
    limit, ceiling = baselines["single_direction_accuracy"], baselines["two_direction_accuracy"]
    return Experiment(
        name="min_of_keys",
        claim_id="E3",
        claim=" ".join(__doc__.split()),
        base=base,
        points=(
            *grid(**{"model.score": ["scaled_dot"], "model.heads": [1, 2], "model.mlp": MLP}),
            ADDITIVE,
            TWO_LAYERS,
        ),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, limit, ceiling),
        learning_rates=(3e-4, 1e-3, 3e-3, 1e-2),
        solved_at=SOLVED,
    )
