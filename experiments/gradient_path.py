"""CLAIMS E7 (gradient part): attention gives every output an O(1) gradient path to every
input, so the gradient reaching position t − L from the output at t does not decay with L; a
recurrent network's path is a chain of L Jacobians, so its gradient decays with L (vanishing
gradients); a CNN's gradient is exactly 0 beyond its receptive field."""

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from attnjax import analysis
from attnjax.experiment import record
from attnjax.experiment.report import markdown_table, new_figure, save_figure
from attnjax.nn import build

WIDTH, FEATURES = 32, 8
MODELS = {
    "attention": dict(kind="transformer", heads=4, causal=True, mlp=False, norms=False),
    "gru": dict(kind="rnn", cell="gru"),
    "lstm": dict(kind="rnn", cell="lstm"),
    "cnn (3 layers, k=3)": dict(kind="cnn", layers=3, kernel_size=3),
}
FLAT, DECAYED = 0.3, 0.01


def gradient_by_distance(model_fields: dict, length: int, seed: int) -> np.ndarray:
    """``g[L] = ‖∂ y_{T-1} / ∂ x_{T-1-L}‖_F`` for L = 0 … T−1 of one model at initialization,
    inputs ``x [T, FEATURES]`` ~ N(0, 1)."""
    config = dict(width=WIDTH, embedding="linear", in_features=FEATURES, num_classes=WIDTH)
    graphdef, state = nnx.split(build(config | model_fields, nnx.Rngs(seed)))
    x = jax.random.normal(jax.random.key(1000 + seed), (length, FEATURES))
    # The state enters the traced function as an argument: the RNNs draw a carry key.
    apply = jax.jit(lambda seq, state: nnx.merge(graphdef, state)({"inputs": seq[None]})[0])
    norms = analysis.gradient_norm_by_position(lambda seq: apply(seq, state), x, length - 1)
    return np.asarray(norms)[::-1]


def far_near(curve: np.ndarray) -> float:
    """Mean gradient over the last quarter of distances / mean over L = 1 … 4."""
    return float(curve[-(len(curve) // 4) :].mean() / curve[1:5].mean())


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Mean over seeds of the gradient norm at distance L, at initialization.

    Verdict rule (declared before measuring), with r = mean g over the last quarter of
    distances / mean g over L = 1 … 4 (L = 0 is the residual/self path; a band, since one
    position's gradient depends on its random input): *supported* iff attention's r ≥
    ``FLAT`` and both the GRU's and the LSTM's r ≤ ``DECAYED``; *refuted* if attention's
    r < ``DECAYED`` or a recurrent r ≥ ``FLAT``; else *inconclusive*.
    The CNN is reported, not judged.
    """
    length, default = (16, 1) if smoke else (128, 5)
    seeds = seeds or default
    per_seed = {name: [gradient_by_distance(fields, length, s) for s in range(seeds)]
                for name, fields in MODELS.items()}  # fmt: skip
    rows = [{"point": n, "seed": s, "far_near_ratio": far_near(c)}
            | {f"gradient_L{d}": float(c[d]) for d in range(length)}
            for n, cs in per_seed.items() for s, c in enumerate(cs)]  # fmt: skip
    _plot(mean_curves(rows), out / "summary.png")
    return report_from_rows({"results.csv": rows})


def mean_curves(rows: list[dict]) -> dict[str, np.ndarray]:
    """Each model's gradient norm by distance ``[T]``, the mean over its seeds' rows (in
    float32, as measured)."""
    names = dict.fromkeys(r["point"] for r in rows)
    length = sum(k.startswith("gradient_L") for k in rows[0])
    return {n: np.mean(np.array([[r[f"gradient_L{d}"] for d in range(length)] for r in rows
                                 if r["point"] == n], np.float32), axis=0)
            for n in names}  # fmt: skip


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per model and seed): table, verdict
    and reason."""
    rows = tables["results.csv"]
    curves = mean_curves(rows)
    length, seeds = len(next(iter(curves.values()))), len(rows) // len(curves)
    shown = [d for d in (1, 2, 4, 8, 16, 32, 64, 127) if d < length]
    table = markdown_table(
        ["model", *(f"L={d}" for d in shown), "r (far / near)"],
        [[n, *(f"{c[d]:.2e}" for d in shown), f"{far_near(c):.2e}"] for n, c in curves.items()],
    )
    ratio = {n: far_near(c) for n, c in curves.items()}
    reason = (
        f"r = mean g[L ≥ {length - length // 4}] / mean g[1 ≤ L ≤ 4] at initialization "
        f"({seeds} seeds): " + ", ".join(f"{n} {r:.2e}" for n, r in ratio.items()) + "."
    )
    rnn = (ratio["gru"], ratio["lstm"])
    if ratio["attention"] >= FLAT and max(rnn) <= DECAYED:
        verdict = "supported"
    else:
        refuted = ratio["attention"] < DECAYED or max(rnn) >= FLAT
        verdict = "refuted" if refuted else "inconclusive"
    return record.analysis("gradient_path", "E7", rows, table, (verdict, reason),
                           ["summary.png"])  # fmt: skip


def _plot(curves: dict[str, np.ndarray], path: Path) -> None:
    fig, ax = new_figure(figsize=(6.5, 4))
    for name, curve in curves.items():
        distances = np.arange(1, len(curve))
        ax.plot(distances, np.maximum(curve[1:], 1e-30), label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-12)
    ax.set_xlabel("distance L (positions back from the output)")
    ax.set_ylabel("‖∂ y_t / ∂ x_(t−L)‖_F (at init, mean over seeds)")
    ax.set_title("gradient reaching an input L steps back")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
