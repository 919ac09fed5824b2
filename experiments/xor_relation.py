"""CLAIMS E1: additive scoring can rank an XOR-relevant key first, a bilinear score cannot —
when key features enter through a linear map of the raw bits. With one embedding per key kind,
a dot product can solve it too."""

import math
from pathlib import Path

from attnjax.experiment import Experiment, Summary, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "xor_relation.py"
SCORES = ["dot", "scaled_dot", "bilinear", "cosine", "additive", "additive_relu"]
SOLVED, FAILED = 0.9, 0.75


def verdict(summary: Summary) -> tuple[str, str]:
    """Supported iff, with the linear encoding, the best 1-head additive score reaches
    ``SOLVED`` while every 1-head bilinear-family score (dot, scaled_dot, bilinear) stays at
    or below ``FAILED`` (interval upper ends), and with the embedding encoding scaled_dot
    reaches ``SOLVED``. Refuted if a bilinear-family score solves the linear encoding or no
    additive score does."""
    acc = {name: s.mean for name, s in summary.items()}
    upper = {n: s.mean + (0 if math.isnan(s.half_width) else s.half_width)
             for n, s in summary.items()}  # fmt: skip

    def key(score: str, encoding: str, heads: int = 1) -> str:
        return f"encoding={encoding} score={score} heads={heads}"

    additive = max(acc[key(s, "linear")] for s in ("additive", "additive_relu"))
    bilinear_family = {s: upper[key(s, "linear")] for s in ("dot", "scaled_dot", "bilinear")}
    dot_embedding = acc[key("scaled_dot", "embedding")]
    detail = (
        f"linear encoding, 1 head: best additive {additive:.3f}, bilinear-family upper "
        f"bounds {', '.join(f'{s} {v:.3f}' for s, v in bilinear_family.items())}; "
        f"embedding encoding: scaled_dot {dot_embedding:.3f}."
    )
    if any(acc[key(s, "linear")] >= SOLVED for s in bilinear_family) or additive < FAILED:
        return "refuted", detail
    if additive >= SOLVED and max(bilinear_family.values()) <= FAILED and dot_embedding >= SOLVED:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="xor_relation",
        claim=" ".join(__doc__.split()),
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=grid(
            **{
                "task.encoding": ["linear", "embedding"],
                "model.score": SCORES,
                "model.heads": [1, 2],
            }
        ),
        metric="accuracy",
        verdict=verdict,
        learning_rates=(1e-3, 3e-3, 1e-2),
    )
