"""CLAIMS E3: one dot-product head with a fixed query ranks keys by a linear function, so it
cannot select the key maximizing min(k1, k2); the seed text says two heads plus a
feed-forward layer can. The yardstick is not chance but the best single linear ranking,
k1 + k2, which already picks the right key in about 79% of examples."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "min_of_keys.py"
MARGIN = 0.03
ADDITIVE = {"model.score": "additive", "model.heads": 1, "model.mlp": False}


def verdict(summary: Summary, limit: float) -> tuple[str, str]:
    """With ``L`` the linear limit: supported iff every 1-head dot point stays at or below
    ``L + MARGIN`` (interval upper end) and 2 dot heads + MLP exceed it (lower end). Refuted
    iff a 1-head dot point exceeds it (lower end) or 2 heads + MLP stay at or below it (upper
    end)."""
    bar = limit + MARGIN
    dot = {"model.score": "scaled_dot"}
    one_dot = [summary[dot | {"model.heads": 1, "model.mlp": mlp}] for mlp in (False, True)]
    two_mlp = summary[dot | {"model.heads": 2, "model.mlp": True}]
    additive = summary[ADDITIVE]
    detail = (
        f"linear limit {limit:.3f}; 1 dot head best {max(s.mean for s in one_dot):.3f}; "
        f"2 dot heads + MLP {two_mlp.mean:.3f} ± {two_mlp.mean - two_mlp.lower:.3f}; "
        f"1 additive head {additive.mean:.3f}."
    )
    if any(s.lower > bar for s in one_dot) or two_mlp.upper <= bar:
        return "refuted", detail
    if all(s.upper <= bar for s in one_dot) and two_mlp.lower > bar:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    limit = base.task.spec.baselines["single_direction_accuracy"]
    return Experiment(
        name="min_of_keys",
        claim_id="E3",
        claim=" ".join(__doc__.split()),
        base=base,
        points=(
            *grid(
                **{"model.score": ["scaled_dot"], "model.heads": [1, 2], "model.mlp": [False, True]}
            ),
            ADDITIVE,
        ),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, limit),
        learning_rates=(1e-3, 3e-3, 1e-2),
    )
