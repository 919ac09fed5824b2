"""CLAIMS M3: at initialization, the expected output norm of multi-head attention does not depend
on the number of heads h at fixed total width D, and the output, the sum of the heads'
contributions, has the variance of h independent heads averaged: each head's contribution
(rescaled to one head's size) has variance σ², their average σ²/h. Measured over many
initializations of :class:`attnjax.nn.MultiHeadAttention` (width D, Xavier init, scaled dot
product) on fresh N(0, 1) inputs; unscaled dot product is reported beside it."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import stats

from attnjax import nn
from attnjax.experiment import combine, record
from attnjax.experiment.report import markdown_table, new_figure, save_figure

WIDTH, TOKENS = 64, 16
XAVIER = nnx.initializers.xavier_uniform()  # the record's initialization (Flax's is LeCun)
HEADS = (1, 2, 4, 8, 16)
INITS = 2048  # initializations per h
TIGHT, LOOSE = (0.9, 1 / 0.9), (0.8, 1.25)  # "≈ 1": interval inside; "≠ 1": interval outside


def head_contributions(key: jax.Array, heads: int, score: str) -> jax.Array:
    """``[heads, T, D]``: each head's contribution to the output of a freshly initialized layer
    (the layer with every other head's gate at 0; the output is their sum, the out bias being 0
    at init) on inputs ``x ~ N(0, 1)`` of shape ``[1, T, D]`` drawn from ``key``."""
    layer = nn.add_head_gates(
        nn.MultiHeadAttention(heads, WIDTH, score=score, kernel_init=XAVIER, rngs=nnx.Rngs(key))
    )
    x = jax.random.normal(jax.random.fold_in(key, 1), (1, TOKENS, WIDTH))
    graphdef, gate, rest = nnx.split(layer, nn.HeadGate, ...)

    def one_head(onehot):
        gated = jax.tree.map(lambda g: onehot.astype(g.dtype), gate)
        return nnx.merge(graphdef, gated, rest)(x)[0]

    return jax.vmap(one_head)(jnp.eye(heads))


def per_seed(seeds: int, heads: int, score: str) -> tuple[np.ndarray, np.ndarray]:
    """Per initialization: the output's mean square ``‖Σ_i c_i‖² / (T D)`` and the heads' sum of
    mean squares ``Σ_i ‖c_i‖² / (T D)``, each ``[seeds]``."""
    keys = jax.random.split(jax.random.key(heads), seeds)
    c = jax.jit(jax.vmap(lambda k: head_contributions(k, heads, score)))(keys)
    total = jnp.mean(jnp.sum(c, axis=1) ** 2, axis=(1, 2))
    separate = jnp.sum(jnp.mean(c**2, axis=(2, 3)), axis=1)
    return np.asarray(total), np.asarray(separate)


def _ratio_ci(a, b, paired: bool) -> tuple[float, float, float]:
    """``mean(a) / mean(b)`` and its 95% bootstrap interval (BCa, fixed seed)."""
    res = stats.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis) / y.mean(axis),
                          paired=paired, n_resamples=2000, random_state=0)  # fmt: skip
    return float(a.mean() / b.mean()), *map(float, res.confidence_interval)


def _judge(intervals: list[tuple[float, float, float]]) -> str:
    if any(hi < LOOSE[0] or lo > LOOSE[1] for _, lo, hi in intervals):
        return "refuted"
    inside = all(TIGHT[0] <= lo and hi <= TIGHT[1] for _, lo, hi in intervals)
    return "supported" if inside else "inconclusive"


def analyze(out: Path, smoke: bool, *, overwrite: bool = False) -> record.Analysis:
    """For h in ``HEADS`` (D = 64, T = 16) and many initializations: (1) the output's mean
    square relative to h = 1; (2) the variance ratio ``E‖Σ c_i‖² / Σ E‖c_i‖²``, which is 1 when
    the heads' contributions are uncorrelated — then the output is the average of h
    independent heads rescaled to one head's size (``u_i = h c_i``, variance σ²), with variance
    σ²/h. Intervals: 95% bootstrap over initializations.

    Verdict rule (declared before measuring), on the scaled dot product: each part is
    *supported* iff every h's interval lies within [0.9, 1/0.9], *refuted* iff some h's interval
    lies outside [0.8, 1.25], else *inconclusive* (h ≥ 2: at h = 1 both ratios are 1 by
    definition); the claim is supported iff both parts are,
    refuted iff either is.
    """
    seeds, heads = (64, (1, 4)) if smoke else (INITS, HEADS)
    rows, curves = [], {}
    for score in ("scaled_dot", "dot"):
        base_total, _ = per_seed(seeds, 1, score)
        for h in heads:
            total, separate = per_seed(seeds, h, score)
            one = (1.0, 1.0, 1.0)
            norm = _ratio_ci(total, base_total, paired=False) if h > 1 else one
            corr = _ratio_ci(total, separate, paired=True) if h > 1 else one
            sigma2 = float(h * separate.mean())  # mean over i of E‖u_i‖², u_i = h c_i
            curves[score, h] = (norm, corr, float(total.mean()), sigma2)
            rows.append({"point": f"{score} h={h}", "seed": 0, "score": score, "heads": h,
                         "output_mean_square": float(total.mean()), "norm_ratio": norm[0],
                         "norm_ratio_low": norm[1], "norm_ratio_high": norm[2],
                         "variance_ratio": corr[0], "variance_ratio_low": corr[1],
                         "variance_ratio_high": corr[2], "one_head_variance": sigma2})  # fmt: skip
    _plot(curves, heads, out / "summary.png")
    return report_from_rows({"results.csv": rows}, seeds)


def report_from_rows(tables: dict[str, list[dict]], seeds: int = INITS) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per score and h) and the number of
    initializations per h it measured: table, verdict and reason."""
    rows = tables["results.csv"]
    at = {(r["score"], r["heads"]): r for r in rows}
    several = [h for s, h in at if s == "scaled_dot" and h > 1]  # at h = 1 both are 1

    def interval(r: dict, name: str) -> tuple[float, float, float]:
        return r[name], r[f"{name}_low"], r[f"{name}_high"]

    parts = {
        part: _judge([interval(at["scaled_dot", h], name) for h in several])
        for part, name in (("norm", "norm_ratio"), ("variance", "variance_ratio"))
    }
    verdict = combine(parts.values())
    norm_range = [at["scaled_dot", h]["norm_ratio"] for h in several]
    var_range = [at["scaled_dot", h]["variance_ratio"] for h in several]
    dot_range = [at["dot", h]["norm_ratio"] for h in several]
    reason = (
        f"scaled dot, h = {several[0]}…{several[-1]} over {seeds} initializations: output "
        f"mean square / (h = 1) from {min(norm_range):.3f} to {max(norm_range):.3f} "
        f"({parts['norm']}); "
        f"E‖Σc‖² / ΣE‖c‖² from {min(var_range):.3f} to {max(var_range):.3f}, i.e. the output "
        f"variance is σ²/h of one head's ({parts['variance']}). Unscaled dot (not judged): "
        f"norm ratio {min(dot_range):.3f}–{max(dot_range):.3f}."
    )
    header = ["score", "h", "E out² (per entry)", "÷ (h = 1) [95%]", "σ² (one head)", "σ²/h",
              "E‖Σc‖² / ΣE‖c‖² [95%]"]  # fmt: skip
    table = [[r["score"], r["heads"], f"{r['output_mean_square']:.4f}",
              "{:.3f} [{:.3f}, {:.3f}]".format(*interval(r, "norm_ratio")),
              f"{r['one_head_variance']:.4f}", f"{r['one_head_variance'] / r['heads']:.4f}",
              "{:.3f} [{:.3f}, {:.3f}]".format(*interval(r, "variance_ratio"))]
             for r in rows]  # fmt: skip
    body = (
        f"Width D = {WIDTH}, T = {TOKENS} tokens, {seeds} initializations per h; c_i is head "
        f"i's contribution to the output, u_i = h c_i one head's output at full size.\n\n"
        + markdown_table(header, table)
    )
    return record.analysis("head_init", "M3", rows, body, (verdict, reason), ["summary.png"])


def _plot(curves, heads: tuple[int, ...], path: Path) -> None:
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(10, 3.6))
    for score, style in (("scaled_dot", "o-"), ("dot", "s--")):
        norm = np.array([curves[score, h][0] for h in heads])
        ax1.errorbar(heads, norm[:, 0], yerr=[norm[:, 0] - norm[:, 1], norm[:, 2] - norm[:, 0]],
                     fmt=style, ms=4, capsize=3, label=score)  # fmt: skip
        if score == "scaled_dot":
            ax2.plot(heads, [curves[score, h][2] for h in heads], "o-", label="output variance")
            ax2.plot(heads, [curves[score, h][3] / h for h in heads], "k:",
                     label="σ²/h (one head's variance / h)")  # fmt: skip
            ax2.plot(heads, [curves[score, h][3] for h in heads], "^-", label="σ² (one head)")
    ax1.axhline(1, color="gray", lw=1)
    ax1.set_ylabel("E out² / E out² at h = 1")
    ax2.set_yscale("log")
    ax2.set_ylabel("variance per output entry")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("heads h (fixed width D)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, f"multi-head attention at initialization, D = {WIDTH}")
