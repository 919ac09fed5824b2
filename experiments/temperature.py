"""CLAIMS S5: dividing the scores by a temperature τ interpolates between argmax (τ → 0:
one-hot weights, entropy 0) and uniform weights (τ → ∞: entropy log S), and the gradient that
reaches the scores vanishes at both extremes."""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax import analysis
from attnjax.experiment import record
from attnjax.experiment.report import markdown_table, new_figure, save_figure

NUM_KEYS, HEAD_DIM = 16, 16
VANISHED = 0.01  # an extreme "vanishes" below this fraction of the peak gradient


def temperature_stats(
    scores: jax.Array, values: jax.Array, direction: jax.Array, tau: float
) -> dict[str, float]:
    """For ``scores [M, S]``, ``values [M, S, H]`` and a loss ``direction [M, H]``, at
    temperature ``tau``: mean entropy and max weight of ``softmax(scores / tau)``, the median
    and mean over rows of ``‖∂w/∂scores‖_F = ‖J‖_F / tau``, and of ``‖∂L/∂scores‖`` for the
    attention output's loss ``L = direction · Σ_s w_s v_s`` (autodiff)."""
    weights = jax.nn.softmax(scores / tau, axis=-1)
    jac = analysis.softmax_jacobian_norm(weights) / tau

    def loss(s, v, g):
        return g @ (jax.nn.softmax(s / tau) @ v)

    grad = jnp.linalg.norm(jax.vmap(jax.grad(loss))(scores, values, direction), axis=-1)
    return {
        "entropy": float(analysis.entropy(weights).mean()),
        "max weight": float(weights.max(-1).mean()),
        "‖∂w/∂z‖ median": float(jnp.median(jac)),
        "‖∂w/∂z‖ mean": float(jac.mean()),
        "‖∂L/∂z‖ median": float(jnp.median(grad)),
        "‖∂L/∂z‖ mean": float(grad.mean()),
    }


def analyze(out: Path, smoke: bool, *, overwrite: bool = False) -> record.Analysis:
    """Entropy and score gradients vs τ for unit-variance scores over ``NUM_KEYS`` keys.

    Verdict rule (declared before measuring): the claim is about a typical row, so it is read on
    the medians over rows. *Supported* iff mean entropy is < 0.05 nats at the smallest τ and
    > 0.99 log S at the largest, and both median gradients at both extreme τ are below
    ``VANISHED`` × their peak over τ with the peak at an interior τ. *Refuted* if some median
    gradient at an extreme is ≥ 0.1 × its peak; else *inconclusive*. The means are reported
    too: rows with near-tied top scores keep a mean gradient of order 1 as τ → 0.
    """
    taus = np.logspace(-3, 3, 7 if smoke else 25)
    samples = 512 if smoke else 8192
    kz, kv, kg = jax.random.split(jax.random.key(0), 3)
    scores = jax.random.normal(kz, (samples, NUM_KEYS))
    values = jax.random.normal(kv, (samples, NUM_KEYS, HEAD_DIM))
    direction = jax.random.normal(kg, (samples, HEAD_DIM)) / math.sqrt(HEAD_DIM)
    stats = [temperature_stats(scores, values, direction, float(t)) for t in taus]
    _plot(taus, stats, out / "summary.png")
    rows = [{"point": f"tau={t:.4g}", "seed": 0, "tau": float(t)} | s
            for t, s in zip(taus, stats, strict=True)]  # fmt: skip
    return report_from_rows({"results.csv": rows})


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per τ): table, verdict and reason."""
    rows = tables["results.csv"]
    taus = [r["tau"] for r in rows]
    stats = [{k: v for k, v in r.items() if k not in ("point", "seed", "tau")} for r in rows]
    names = list(stats[0])
    table = markdown_table(
        ["τ", *names],
        [[f"{t:.3g}", *(f"{s[n]:.3g}" for n in names)] for t, s in zip(taus, stats, strict=True)],
    )
    checks, ratios = {}, {}
    for name in ("‖∂w/∂z‖ median", "‖∂L/∂z‖ median"):
        curve = np.array([s[name] for s in stats])
        ratios[name] = (curve[0] / curve.max(), curve[-1] / curve.max())
        checks[name] = max(ratios[name]) < VANISHED and 0 < curve.argmax() < len(curve) - 1
    ent_lo, ent_hi = stats[0]["entropy"], stats[-1]["entropy"]
    checks["entropy"] = ent_lo < 0.05 and ent_hi > 0.99 * math.log(NUM_KEYS)
    reason = (
        f"τ {taus[0]:g}→{taus[-1]:g}: entropy {ent_lo:.3g}→{ent_hi:.3f} nats (log S = "
        f"{math.log(NUM_KEYS):.3f}); median gradient at the extremes / its peak: "
        + "; ".join(f"{n.split()[0]} {lo:.1e} and {hi:.1e}" for n, (lo, hi) in ratios.items())
        + f". Mean ‖∂w/∂z‖ at τ = {taus[0]:g}: {stats[0]['‖∂w/∂z‖ mean']:.3g} (peak "
        f"{max(s['‖∂w/∂z‖ mean'] for s in stats):.3g}): near-tied rows keep the mean from "
        "vanishing."
    )
    if all(checks.values()):
        verdict = "supported"
    else:
        verdict = "refuted" if any(max(r) >= 0.1 for r in ratios.values()) else "inconclusive"
    return record.analysis("temperature", "S5", rows, table, (verdict, reason), ["summary.png"])


def _plot(taus: np.ndarray, stats: list[dict[str, float]], path: Path) -> None:
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 3.8))
    ax1.plot(taus, [s["entropy"] for s in stats], "o-", ms=3, label="mean entropy")
    ax1.axhline(math.log(NUM_KEYS), color="gray", ls=":", label=f"log S (S = {NUM_KEYS})")
    ax1.set_ylabel("entropy of softmax(z / τ) (nats)")
    for name in stats[0]:
        if name.startswith("‖"):
            ax2.plot(taus, [s[name] for s in stats], "--" if "mean" in name else "o-", ms=3,
                     label=name)  # fmt: skip
    ax2.set_yscale("log")
    ax2.set_ylabel("gradient norm w.r.t. scores z")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("temperature τ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, f"softmax temperature, z ~ N(0, 1), {NUM_KEYS} keys")
