"""CLAIMS S1, S2: for unit-variance q, k, Var(q·k) = H, so unscaled dot-product softmax
saturates as the head size H grows while 1/sqrt(H) scaling keeps it flat (Vaswani et al.,
2017); trained, unscaled dot attention degrades with H and additive does not (Britz et al.,
2017), and scaling should fix dot (Vaswani's hypothesis, untested by Britz)."""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnjax import analysis
from attnjax.experiment import Experiment, Summary, grid, load_file, record
from attnjax.experiment.report import markdown_table, new_figure, save_figure
from attnjax.nn.scores import make_score

_CONFIG = Path(__file__).parents[1] / "configs" / "dk_scaling.py"
HEAD_DIMS = (4, 16, 64, 256, 1024)
NUM_KEYS = 16
INIT_SCORES = ("dot", "scaled_dot", "cosine", "additive")
REFERENCE = "N(0, H) logits"  # CLAIMS S1's independent-logit numbers
PUBLISHED = {4: (0.46, 1.65), 1024: (0.96, 0.09)}  # H: (max weight, entropy nats)
WIDTHS, TRAIN_SCORES, DEGRADED = (16, 128, 512), ("dot", "scaled_dot", "additive"), 0.05


def init_stats(logits: jax.Array) -> tuple[float, float, float, float]:
    """``logits [M, S]`` -> (Var, mean max softmax weight, mean entropy nats, mean softmax
    Jacobian norm)."""
    w = jax.nn.softmax(logits, axis=-1)
    return (
        float(jnp.var(logits)),
        float(w.max(-1).mean()),
        float(analysis.entropy(w).mean()),
        float(analysis.softmax_jacobian_norm(w).mean()),
    )


def init_logits(score: str, head_dim: int, num_samples: int, seed: int = 0) -> jax.Array:
    """Logits ``[M, S]`` of one query against ``NUM_KEYS`` keys, q, k ~ N(0, I_H), for a score
    module at its initialization (cosine: QKNorm scale for length ``NUM_KEYS``)."""
    kq, kk, kp = jax.random.split(jax.random.key(seed), 3)
    if score == REFERENCE:
        return jax.random.normal(kq, (num_samples, NUM_KEYS)) * math.sqrt(head_dim)
    q = jax.random.normal(kq, (num_samples, 1, 1, head_dim))
    k = jax.random.normal(kk, (num_samples, 1, NUM_KEYS, head_dim))
    options = {"length": NUM_KEYS} if score == "cosine" else {}
    module = make_score(score, 1, head_dim, options=options, rngs=nnx.Rngs(kp))
    return module.logits(q, k)[:, 0, 0]


def analyze(out: Path, smoke: bool) -> record.Analysis:
    """S1 at initialization: Var, max weight, entropy and Jacobian norm per score and H.

    Verdict rule (declared before measuring): *supported* iff unscaled dot's Var/H is in
    [0.8, 1.25] at every H, scaled dot's Var is in [0.8, 1.25] at every H, unscaled dot's max
    weight rises from < 0.6 to > 0.9 and its entropy falls from > 1.4 to < 0.3 nats between the
    smallest and largest H, scaled dot's max weight moves < 0.05 across H, and the reference
    N(0, H) logits match CLAIMS' published numbers within 0.03 (weight) and 0.1 nats. *Refuted*
    if unscaled dot's max weight at the largest H is < 0.6; else *inconclusive*.
    """
    dims, samples = ((4, 64), 256) if smoke else (HEAD_DIMS, 4096)
    stats = {(s, h): init_stats(init_logits(s, h, samples))
             for s in (*INIT_SCORES, REFERENCE) for h in dims}  # fmt: skip
    rows = [[s, h, *(f"{v:.3g}" for v in stats[s, h])] for s in (*INIT_SCORES, REFERENCE)
            for h in dims]  # fmt: skip
    table = markdown_table(["score", "H", "Var", "max weight", "entropy (nats)", "‖J‖_F"], rows)
    _plot(stats, dims, out / "dk_scaling_init.png")
    lo, hi = dims[0], dims[-1]
    dot, scaled = {h: stats["dot", h] for h in dims}, {h: stats["scaled_dot", h] for h in dims}
    checks = {
        "dot Var/H in [0.8, 1.25]": all(0.8 <= dot[h][0] / h <= 1.25 for h in dims),
        "scaled Var in [0.8, 1.25]": all(0.8 <= scaled[h][0] <= 1.25 for h in dims),
        "dot saturates": dot[lo][1] < 0.6 < 0.9 < dot[hi][1]
        and dot[lo][2] > 1.4 > 0.3 > dot[hi][2],
        "scaled flat": np.ptp([v[1] for v in scaled.values()]) < 0.05,
        "reference matches published": all(
            abs(stats[REFERENCE, h][1] - w) < 0.03 and abs(stats[REFERENCE, h][2] - e) < 0.1
            for h, (w, e) in PUBLISHED.items() if h in dims
        ),
    }  # fmt: skip
    reason = (
        f"H {lo}→{hi}: dot max weight {dot[lo][1]:.2f}→{dot[hi][1]:.2f}, entropy "
        f"{dot[lo][2]:.2f}→{dot[hi][2]:.2f} nats; scaled dot {scaled[lo][1]:.2f}→"
        f"{scaled[hi][1]:.2f}; additive {stats['additive', lo][1]:.2f}→"
        f"{stats['additive', hi][1]:.2f}; cosine {stats['cosine', lo][1]:.2f}→"
        f"{stats['cosine', hi][1]:.2f}. Checks: "
        + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in checks.items())
        + "."
    )
    if all(checks.values()):
        verdict = "supported"
    else:
        verdict = "refuted" if dot[hi][1] < 0.6 else "inconclusive"
    names = ("variance", "max_weight", "entropy", "jacobian_norm")
    rows = [{"point": f"score={s} H={h}", "seed": 0, "score": s, "head_dim": h}
            | dict(zip(names, v, strict=True)) for (s, h), v in stats.items()]  # fmt: skip
    return record.analysis("dk_scaling", "S1", rows, table, (verdict, reason),
                           ["dk_scaling_init.png"], csv_name="analysis.csv")  # fmt: skip


def _plot(stats: dict, dims: tuple[int, ...], path: Path) -> None:
    fig, axes = new_figure(1, 3, figsize=(13, 3.8))
    labels = ("Var(logit)", "mean max softmax weight", "mean entropy (nats)")
    for i, (ax, ylabel) in enumerate(zip(axes, labels, strict=True)):
        for s in (*INIT_SCORES, REFERENCE):
            style = "k--" if s == REFERENCE else "o-"
            ax.plot(dims, [stats[s, h][i] for h in dims], style, label=s, ms=4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("head size H")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[2].axhline(math.log(NUM_KEYS), color="gray", lw=0.8, ls=":", label="uniform (log 16)")
    axes[2].legend(fontsize=8)
    save_figure(fig, path, f"scores at initialization, q, k ~ N(0, I_H), {NUM_KEYS} keys")


def verdict(summary: Summary) -> tuple[str, str]:
    """S2, declared before training: with widths w_min < w_max, a score *degrades* if its mean
    accuracy at w_max is more than ``DEGRADED`` below its accuracy at w_min. *Supported* iff
    unscaled dot degrades and neither scaled dot nor additive does; *refuted* if dot does not
    degrade, or scaled dot and additive degrade as well; else *inconclusive*."""
    widths = sorted({p["model.width"] for p, _ in summary})
    acc = {(s, w): summary[{"model.score": s, "model.width": w}].mean
           for s in TRAIN_SCORES for w in widths}  # fmt: skip
    drop = {s: acc[s, widths[0]] - acc[s, widths[-1]] for s in TRAIN_SCORES}
    degrades = {s: d > DEGRADED for s, d in drop.items()}
    reason = "accuracy drop from width {} to {}: {}.".format(
        widths[0], widths[-1], ", ".join(f"{s} {d:+.3f}" for s, d in drop.items())
    )
    if degrades["dot"] and not degrades["scaled_dot"] and not degrades["additive"]:
        return "supported", reason
    if not degrades["dot"] or (degrades["scaled_dot"] and degrades["additive"]):
        return "refuted", reason
    return "inconclusive", reason


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="dk_scaling",
        claim_id="S2",
        claim=" ".join(__doc__.split()),
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=grid(**{"model.score": TRAIN_SCORES, "model.width": (8,) if smoke else WIDTHS}),
        metric="accuracy",
        verdict=verdict,
        learning_rates=None if smoke else (1e-3, 3e-3),
    )
