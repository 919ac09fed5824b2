"""CLAIMS E6: two attention layers solve multi-query associative recall (an induction
circuit: one layer copies each key into its value's position, the next looks it up); one
layer stays near chance. Zoology (Fig. 2) finds attention's accuracy flat in model width.
Scaled down for a CPU: vocabulary 64 (Zoology 8192; CLAIMS 256), length 32 (64), 4 pairs,
widths 16-64, 600 steps."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "mqar.py"
WIDTHS = [16, 32, 64]
SOLVED, FAILED = 0.99, 0.5


def verdict(summary: Summary, near_chance: float) -> tuple[str, str]:
    """Supported iff 2 layers reach ``SOLVED`` (mean) at every width and 1 layer stays at or
    below ``near_chance`` = 1/num_pairs, the score of guessing among the context's values
    (interval upper end). Refuted iff 1 layer exceeds ``FAILED`` (lower end) at some width
    or 2 layers stay below it (upper end) at every width."""
    one, two = ([summary[{"model.layers": n, "model.width": w}] for w in WIDTHS] for n in (1, 2))
    detail = (
        f"widths {WIDTHS}: 1 layer {', '.join(f'{s.mean:.3f}' for s in one)}; "
        f"2 layers {', '.join(f'{s.mean:.3f}' for s in two)}."
    )
    if any(s.lower > FAILED for s in one) or all(s.upper < FAILED for s in two):
        return "refuted", detail
    if all(s.mean >= SOLVED for s in two) and all(s.upper <= near_chance for s in one):
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    """One learning rate (1e-3, Adam) for every point: the question is whether one layer can
    represent the circuit at all, not a tuned accuracy; CPU time rules out a grid."""
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    near_chance = 1 / base.task.num_pairs
    return Experiment(
        name="mqar",
        claim_id="E6",
        claim=" ".join(__doc__.split()),
        base=base,
        points=grid(**{"model.layers": [1, 2], "model.width": WIDTHS}),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, near_chance),
        solved_at=SOLVED,
    )
