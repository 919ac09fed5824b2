"""CLAIMS S1, S2: for unit-variance q, k, Var(q·k) = H, so unscaled dot-product softmax
saturates as the head size H grows while 1/sqrt(H) scaling keeps it flat (Vaswani et al.,
2017); trained, unscaled dot attention degrades as H grows and additive does not (Britz et al.,
2017), and scaling should fix dot (Vaswani's hypothesis, untested by Britz).

S2 trains one pre-LN attention layer of fixed width on a key-value retrieval
(configs/dk_scaling.py), varying only the head size H (additive: hidden size = H) and the
score, under Adam and under plain SGD, each with its own learning-rate grid; the metric is the
final test cross-entropy (no ceiling). A pilot (2 seeds, H 8 and 512, three rates per
optimizer, all three scores) set the task size, the steps, the H grid and the rate grids (wide
enough for every best rate it found, at a cost the full run can afford); the rule was written
after the pilot and before the full run, and the pilot's losses did not set its threshold."""

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnjax import analysis, nn, tasks
from attnjax.experiment import Experiment, Stats, Summary, grid, load_file, record, with_overrides
from attnjax.experiment.config import ExperimentConfig
from attnjax.experiment.report import markdown_table, mean_ci95, new_figure, save_figure
from attnjax.nn.scores import make_score

_CONFIG = Path(__file__).parents[1] / "configs" / "dk_scaling.py"
HEAD_DIMS = (4, 16, 64, 256, 1024)
NUM_KEYS = 16
INIT_SCORES = ("dot", "scaled_dot", "cosine", "additive")
REFERENCE = "N(0, H) logits"  # CLAIMS S1's independent-logit numbers
INIT_STATS = ("variance", "max_weight", "entropy", "jacobian_norm")  # init_stats's order
PUBLISHED = {4: (0.46, 1.65), 1024: (0.96, 0.09)}  # H: (max weight, entropy nats)
TRAIN_DIMS, TRAIN_SCORES = (4, 32, 256), ("dot", "scaled_dot", "additive")
LEARNING_RATES = {"adamw": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2), "sgd": (0.03, 0.1, 0.3, 1.0)}
EFFECT = 0.1  # nats: the smallest rise in test loss from the smallest to the largest H that counts
VAR_RATIO = (0.5, 2.0)  # unscaled Var(logit) / H at initialization must lie in this band


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


def analyze(out: Path, smoke: bool, *, overwrite: bool = False) -> record.Analysis:
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
    _plot(stats, dims, out / "dk_scaling_init.png")
    rows = [{"point": f"score={s} H={h}", "seed": 0, "score": s, "head_dim": h}
            | dict(zip(INIT_STATS, v, strict=True)) for (s, h), v in stats.items()]  # fmt: skip
    return report_from_rows({"analysis.csv": rows})


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The S1 record of :func:`analyze` from its rows (one per score and H): table, verdict
    and reason."""
    rows = tables["analysis.csv"]
    stats = {(r["score"], r["head_dim"]): tuple(r[n] for n in INIT_STATS) for r in rows}
    dims = tuple(dict.fromkeys(h for _, h in stats))
    table = markdown_table(["score", "H", "Var", "max weight", "entropy (nats)", "‖J‖_F"],
                           [[s, h, *(f"{v:.3g}" for v in values)]
                            for (s, h), values in stats.items()])  # fmt: skip
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


def model_init_variance(config: ExperimentConfig, seeds: int = 5, batch: int = 256) -> float:
    """Var of the first attention layer's raw logits ``[B, N, T, S]`` on one batch of the task,
    pooled over the models of ``seeds`` initializations (mean of the per-model variances)."""
    inputs = tasks.get("xor_relation").generate(jax.random.key(0), batch, config.task)["inputs"]

    def variance(seed: jax.Array) -> jax.Array:
        model = nn.build(config.model, nnx.Rngs(jax.random.key(seed)))
        layer = model.encoder.blocks[0]
        x = layer.attention_norm(model.embed(inputs))
        q, k = (
            jnp.swapaxes(proj(x), 1, 2) for proj in (layer.attention.query, layer.attention.key)
        )
        return jnp.var(layer.attention.score.logits(q, k))

    return float(jnp.mean(jax.jit(jax.vmap(variance))(jnp.arange(seeds))))


def rise(lo: Stats, hi: Stats) -> tuple[float, float]:
    """Mean and 95% half-width (0 for one seed) of the per-seed rise in test loss from point
    ``lo`` to point ``hi`` (seeds paired: a seed draws the same batches at every H)."""
    mean, half = mean_ci95([b - a for a, b in zip(lo.values, hi.values, strict=True)])
    return mean, 0.0 if math.isnan(half) else half


def verdict(summary: Summary, init_ratio: dict[int, float]) -> tuple[str, str]:
    """S2, declared before the full run. ``init_ratio[H]``: unscaled dot's logit
    variance at initialization over H, measured in this setup. Per optimizer and score, the
    rise in test loss from the smallest to the largest H, mean ± 95% interval over seeds:
    *degrades* iff the mean is ≥ ``EFFECT`` nats and the interval excludes 0; *flat* iff the
    interval's upper end is < ``EFFECT``; else unclear. *Supported* iff under each optimizer
    (1) unscaled dot degrades, (2) additive is flat and (3) scaled dot is flat. *Refuted* iff
    under some optimizer unscaled dot is flat or additive or scaled dot degrades. Else, or if
    some ``init_ratio`` lies outside ``VAR_RATIO`` (the setup misses the regime the claim is
    about), *inconclusive*."""
    optimizers = sorted({p["optim.optimizer"] for p, _ in summary})
    dims = sorted({p["model.head_dim"] for p, _ in summary})
    parts, texts = {}, []
    for o in optimizers:
        for s in TRAIN_SCORES:
            lo, hi = (summary[{"optim.optimizer": o, "model.score": s, "model.head_dim": h}]
                      for h in (dims[0], dims[-1]))  # fmt: skip
            mean, half = rise(lo, hi)
            degrades = mean >= EFFECT and mean - half > 0
            parts[o, s] = "degrades" if degrades else "flat" if mean + half < EFFECT else "unclear"
            texts.append(f"{o} {s} {mean:+.3f} ± {half:.3f} ({parts[o, s]})")
    expected = {"dot": "degrades", "scaled_dot": "flat", "additive": "flat"}
    contrary = {"dot": "flat", "scaled_dot": "degrades", "additive": "degrades"}
    regime = all(VAR_RATIO[0] <= r <= VAR_RATIO[1] for r in init_ratio.values())
    reason = (
        f"Test loss rise (nats) from H = {dims[0]} to {dims[-1]}, effect size {EFFECT}: "
        + "; ".join(texts)
        + ". At initialization unscaled Var(logit)/H = "
        + ", ".join(f"{r:.2f} (H {h})" for h, r in sorted(init_ratio.items()))
        + f"{'' if regime else f', outside {VAR_RATIO}: the setup misses the regime'}."
    )
    if not regime:
        return "inconclusive", reason
    if all(parts[o, s] == expected[s] for o in optimizers for s in TRAIN_SCORES):
        return "supported", reason
    if any(parts[o, s] == contrary[s] for o in optimizers for s in TRAIN_SCORES):
        return "refuted", reason
    return "inconclusive", reason


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    dims = TRAIN_DIMS[:2] if smoke else TRAIN_DIMS
    dot = {"model.score": "dot"}
    init_ratio = {h: model_init_variance(with_overrides(base, dot | {"model.head_dim": h})) / h
                  for h in dims}  # fmt: skip
    rates = {o: r[1:2] for o, r in LEARNING_RATES.items()} if smoke else LEARNING_RATES
    axes = {"optim.optimizer": tuple(rates), "model.score": TRAIN_SCORES, "model.head_dim": dims}
    return Experiment(
        name="dk_scaling",
        claim_id="S2",
        claim=" ".join(__doc__.split("\n\n")[0].split()),
        base=base,
        points=grid(**axes),
        metric="loss",
        verdict=functools.partial(verdict, init_ratio=init_ratio),
        learning_rates=lambda point: rates[point["optim.optimizer"]],
        higher_is_better=False,
    )
