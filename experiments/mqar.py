"""CLAIMS E6: two attention layers solve multi-query associative recall (an induction
circuit: one layer copies each key into its value's position, the next looks it up); one
layer stays near chance, here the structural ceiling 1/num_pairs (one causal layer cannot move
a value's identity next to its key, so at best it picks among the context's values). Zoology
(Fig. 2) finds attention's accuracy flat in model width from 64 up. Scaled down for a CPU:
vocabulary 64 (Zoology 8192; CLAIMS 256), length 32 (64), 4 pairs, widths 64-256, 600 steps."""

import math
from pathlib import Path

from attnjax.experiment import Experiment, Summary, combine, grid, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "mqar.py"
WIDTHS = [64, 128, 256]
SOLVED, FAILED, FLAT = 0.99, 0.5, 0.02


def one_layer_bound(num_pairs: int, eval_examples: int) -> float:
    """The 1-layer ceiling ``1/num_pairs`` plus three binomial standard errors of a test draw
    (``num_pairs`` queries per example): the margin for evaluation noise."""
    p, n = 1 / num_pairs, num_pairs * eval_examples
    return p + 3 * math.sqrt(p * (1 - p) / n)


def verdict(summary: Summary, bound: float) -> tuple[str, str]:
    """Three parts, each point at its best learning rate. (1) Two layers solve it: supported
    iff the mean reaches ``SOLVED`` at every width, refuted iff every width's interval lies
    below ``FAILED``. (2) One layer stays at the ceiling: supported iff every width's interval
    upper end is at most ``bound`` (ceiling + noise margin), refuted iff some lower end exceeds
    it. (3) Flat in width: supported iff the two-layer means span at most ``FLAT``, refuted iff
    two widths' intervals are disjoint and their means differ by more than 2·``FLAT``. The claim
    is supported iff all three parts are, refuted iff any is, else inconclusive."""
    one, two = ([summary[{"model.layers": n, "model.width": w}] for w in WIDTHS] for n in (1, 2))
    means = [s.mean for s in two]
    parts = {}
    if all(m >= SOLVED for m in means):
        parts["2 layers solve"] = "supported"
    else:
        parts["2 layers solve"] = (
            "refuted" if all(s.upper < FAILED for s in two) else "inconclusive"
        )
    if any(s.lower > bound for s in one):
        parts["1 layer at the ceiling"] = "refuted"
    else:
        at_ceiling = all(s.upper <= bound for s in one)
        parts["1 layer at the ceiling"] = "supported" if at_ceiling else "inconclusive"
    apart = any(a.upper < b.lower and b.mean - a.mean > 2 * FLAT for a in two for b in two)
    flat = max(means) - min(means) <= FLAT
    parts["flat in width"] = "refuted" if apart else "supported" if flat else "inconclusive"
    detail = (
        f"widths {WIDTHS}: 1 layer {', '.join(f'{s.mean:.3f}' for s in one)} (ceiling + noise "
        f"margin {bound:.3f}); 2 layers {', '.join(f'{m:.3f}' for m in means)}; "
        + "; ".join(f"{k}: {v}" for k, v in parts.items())
        + "."
    )
    return combine(parts.values()), detail


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    bound = one_layer_bound(base.task.num_pairs, base.train.eval_batch_size)
    return Experiment(
        name="mqar",
        claim_id="E6",
        claim=" ".join(__doc__.split()),
        base=base,
        points=grid(**{"model.layers": [1, 2], "model.width": WIDTHS}),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, bound),
        learning_rates=(3e-4, 1e-3, 3e-3),
        solved_at=SOLVED,
    )
