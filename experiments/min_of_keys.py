"""CLAIMS E3: one dot-product head with a fixed query ranks keys by a linear function, so it
cannot select the key maximizing min(k1, k2); the seed text says two heads plus a
feed-forward layer can. The yardstick is not chance but the best single linear ranking,
k1 + k2, which already picks the right key in about 79% of examples."""

from pathlib import Path

import numpy as np

from attnjax.experiment import Experiment, Summary, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "min_of_keys.py"
MARGIN = 0.03


def linear_limit(num_keys: int, samples: int = 200_000) -> float:
    """How often ranking by ``k1 + k2`` picks the maximizer of ``min(k1, k2)``."""
    keys = np.random.default_rng(0).random((samples, num_keys, 2))
    return float(np.mean(keys.sum(-1).argmax(-1) == keys.min(-1).argmax(-1)))


def verdict(summary: Summary, limit: float) -> tuple[str, str]:
    """With ``L`` the linear limit: supported iff every 1-head dot point stays at or below
    ``L + MARGIN`` (interval upper end) and 2 dot heads + MLP exceed it (lower end). Refuted
    iff a 1-head dot point exceeds it (lower end) or 2 heads + MLP stay at or below it (upper
    end)."""
    bar = limit + MARGIN
    one_dot = [s for n, s in summary.items() if "scaled_dot heads=1" in n]
    two_mlp = summary["score=scaled_dot heads=2 mlp=True"]
    detail = (
        f"linear limit {limit:.3f}; 1 dot head best {max(s.mean for s in one_dot):.3f}; "
        f"2 dot heads + MLP {two_mlp.mean:.3f} ± {two_mlp.mean - two_mlp.lower:.3f}; "
        f"1 additive head {summary['score=additive heads=1 mlp=False'].mean:.3f}."
    )
    if any(s.lower > bar for s in one_dot) or two_mlp.upper <= bar:
        return "refuted", detail
    if all(s.upper <= bar for s in one_dot) and two_mlp.lower > bar:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    limit = linear_limit(base.task.num_keys)
    return Experiment(
        name="min_of_keys",
        claim=" ".join(__doc__.split()),
        base=base,
        points=(
            *grid(
                **{"model.score": ["scaled_dot"], "model.heads": [1, 2], "model.mlp": [False, True]}
            ),
            {"model.score": "additive", "model.heads": 1, "model.mlp": False},
        ),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, limit),
        learning_rates=(1e-3, 3e-3, 1e-2),
    )
