"""CLAIMS E4: a dot-product score is fooled by a key of large norm (here at cosine 0.5 with
the query, so it outscores the true match once its norm exceeds 2); additive scoring (tanh
saturates) and cosine scoring are not."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "impostor.py"
NORMS = [1.0, 4.0, 16.0]
SCORES = ["dot", "cosine", "additive"]


def verdict(summary: Summary) -> tuple[str, str]:
    """At the largest norm: supported iff dot's interval lies below both cosine's and
    additive's, and below dot's own at the smallest norm; refuted iff dot's interval lies at
    or above cosine's or additive's (no disadvantage). Otherwise inconclusive."""

    def at(score: str, norm: float):
        return summary[{"model.score": score, "task.impostor_norm": norm}]

    dot, small = at("dot", NORMS[-1]), at("dot", NORMS[0])
    others = [at(s, NORMS[-1]) for s in SCORES[1:]]
    detail = (
        f"impostor norm {NORMS[-1]:g}: "
        + ", ".join(f"{s} {at(s, NORMS[-1]).mean:.3f}" for s in SCORES)
        + f"; dot at norm {NORMS[0]:g}: {small.mean:.3f}."
    )
    if any(dot.lower >= o.upper for o in others):
        return "refuted", detail
    if all(dot.upper < o.lower for o in others) and dot.upper < small.lower:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="impostor",
        claim_id="E4",
        claim=" ".join(__doc__.split()),
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=grid(**{"model.score": SCORES, "task.impostor_norm": NORMS}),
        metric="accuracy",
        verdict=verdict,
        learning_rates=(1e-3, 3e-3, 1e-2),
    )
