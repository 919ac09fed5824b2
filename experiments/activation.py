"""CLAIMS S8: additive attention vᵀ act(W_q q + W_k k + b) without a bias can cancel into
near-uniform attention at initialization, and the bias keeps tanh in its active range; with
ReLU instead of tanh some hidden units are dead (never positive), and a positive bias helps."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnjax import analysis
from attnjax.experiment import record
from attnjax.experiment.report import markdown_table, new_figure, save_figure
from attnjax.nn.scores import make_score

HEAD_DIM, NUM_KEYS = 16, 16
BIASES = {"none": None, "zero (default init)": 0.0, "+1": 1.0}
SCALES = (0.1, 1.0, 10.0)  # input standard deviation
EFFECT = 0.05  # nats of entropy, or a fraction of units


def init_stats(score: str, bias: float | None, scale: float, samples: int) -> dict[str, float]:
    """Attention of one query over ``NUM_KEYS`` keys, q, k ~ N(0, scale² I_H), for a freshly
    initialized additive score (hidden size H) with bias ``None`` (absent) or a constant: mean
    entropy (nats), fraction of hidden units dead for a query (pre-activation ≤ 0 for every
    key) and fraction saturated (|pre-activation| > 2, where tanh' < 0.07)."""
    kq, kk, kp = jax.random.split(jax.random.key(0), 3)
    q = scale * jax.random.normal(kq, (samples, 1, 1, HEAD_DIM))
    k = scale * jax.random.normal(kk, (samples, 1, NUM_KEYS, HEAD_DIM))
    module = make_score(score, 1, HEAD_DIM, options={"use_bias": bias is not None},
                        rngs=nnx.Rngs(kp))  # fmt: skip
    if bias is not None:
        module.b[...] = jnp.full_like(module.b[...], bias)
    p = module()
    pre = q @ p["w_q"] + k @ p["w_k"] + p.get("b", 0.0)  # [M, 1, S, A]
    weights = jax.nn.softmax(module.logits(q, k), axis=-1)
    return {
        "entropy": float(analysis.entropy(weights).mean()),
        "dead units": float(jnp.all(pre <= 0, axis=-2).mean()),
        "saturated": float((jnp.abs(pre) > 2).mean()),
    }


def analyze(out: Path, smoke: bool) -> record.Analysis:
    """Entropy, dead and saturated hidden units at initialization for tanh/relu × bias ×
    input scale (log 16 = 2.77 nats is uniform).

    Verdict rule (declared before measuring), at input scale 1: the bias claim holds if tanh's
    entropy without a bias exceeds its entropy with the default zero-initialized bias by more
    than ``EFFECT`` nats, and the ReLU claim holds if ReLU's dead-unit fraction without a bias
    is above 0 and exceeds that with bias +1 by more than ``EFFECT``. *Supported* iff both
    hold, *refuted* iff neither does, else *inconclusive*.
    """
    samples = 256 if smoke else 4096
    stats = {
        (s, b, x): init_stats(s, v, x, samples)
        for s in ("additive", "additive_relu")
        for b, v in BIASES.items()
        for x in SCALES
    }
    names = list(next(iter(stats.values())))
    table = markdown_table(
        ["score", "bias", "input std", *names],
        [[s, b, x, *(f"{v[n]:.3f}" for n in names)] for (s, b, x), v in stats.items()],
    )  # fmt: skip
    _plot(stats, out / "summary.png")
    tanh = {b: stats["additive", b, 1.0] for b in BIASES}
    relu = {b: stats["additive_relu", b, 1.0] for b in BIASES}
    bias_claim = tanh["none"]["entropy"] - tanh["zero (default init)"]["entropy"] > EFFECT
    dead_none, dead_pos = relu["none"]["dead units"], relu["+1"]["dead units"]
    relu_claim = dead_none > 0 and dead_none - dead_pos > EFFECT
    reason = (
        f"input std 1: tanh entropy without bias {tanh['none']['entropy']:.3f}, zero-init bias "
        f"{tanh['zero (default init)']['entropy']:.3f}, bias +1 {tanh['+1']['entropy']:.3f} "
        f"nats (uniform 2.773); ReLU dead units without bias {dead_none:.3f}, zero-init "
        f"{relu['zero (default init)']['dead units']:.3f}, bias +1 {dead_pos:.3f}. Bias claim: "
        f"{'holds' if bias_claim else 'does not hold'}; ReLU claim: "
        f"{'holds' if relu_claim else 'does not hold'}."
    )
    verdict = {2: "supported", 0: "refuted"}.get(bias_claim + relu_claim, "inconclusive")
    rows = [{"point": f"score={s} bias={b} input_std={x}", "seed": 0, "score": s, "bias": b,
             "input_std": x} | v for (s, b, x), v in stats.items()]  # fmt: skip
    return record.analysis("activation", "S8", rows, table, (verdict, reason), ["summary.png"])


def _plot(stats: dict, path: Path) -> None:
    fig, axes = new_figure(1, 3, figsize=(13, 3.8))
    for ax, name in zip(axes, ("entropy", "dead units", "saturated"), strict=True):
        for s in ("additive", "additive_relu"):
            for b in BIASES:
                style = "o-" if s == "additive" else "s--"
                ax.plot(SCALES, [stats[s, b, x][name] for x in SCALES], style, ms=4,
                        label=f"{'tanh' if s == 'additive' else 'relu'}, bias {b}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("input standard deviation")
        ax.set_ylabel({"entropy": "mean attention entropy (nats)",
                       "dead units": "fraction of hidden units dead for a query",
                       "saturated": "fraction |pre-activation| > 2"}[name])  # fmt: skip
        ax.grid(alpha=0.3)
    axes[0].axhline(np.log(NUM_KEYS), color="gray", ls=":", label="uniform")
    axes[0].legend(fontsize=7)
    save_figure(
        fig, path, f"additive scores at initialization, H = A = {HEAD_DIM}, {NUM_KEYS} keys"
    )
