"""CLAIMS E1: additive scoring can rank an XOR-relevant key first, a bilinear score cannot —
when key features enter through a linear map of the raw bits. With one embedding per key kind,
a dot product can solve it too."""

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

    def at(score: str, encoding: str, heads: int = 1):
        return summary[{"task.encoding": encoding, "model.score": score, "model.heads": heads}]

    additive = max(at(s, "linear").mean for s in ("additive", "additive_relu"))
    bilinear_family = {s: at(s, "linear").upper for s in ("dot", "scaled_dot", "bilinear")}
    dot_embedding = at("scaled_dot", "embedding").mean
    detail = (
        f"linear encoding, 1 head: best additive {additive:.3f}, bilinear-family upper "
        f"bounds {', '.join(f'{s} {v:.3f}' for s, v in bilinear_family.items())}; "
        f"embedding encoding: scaled_dot {dot_embedding:.3f}."
    )
    if any(at(s, "linear").mean >= SOLVED for s in bilinear_family) or additive < FAILED:
        return "refuted", detail
    if additive >= SOLVED and max(bilinear_family.values()) <= FAILED and dot_embedding >= SOLVED:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="xor_relation",
        claim_id="E1",
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
        solved_at=SOLVED,
    )
