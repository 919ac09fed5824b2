"""CLAIMS M2: many heads of a trained multi-head model can be pruned with little loss, then
performance falls off a cliff (Michel et al., 2019; Voita et al., 2019); the order comes from
head importance I_h = E|∂L/∂ξ_h| for the head gates ξ, or from entropy and redundancy."""

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from attnjax import tasks
from attnjax.analysis import pruning
from attnjax.experiment import load_file, load_run, record, train_and_evaluate
from attnjax.experiment.config import task_name
from attnjax.experiment.report import markdown_table, new_figure, save_figure

_CONFIG = Path(__file__).parents[1] / "configs" / "head_pruning.py"
RANDOM_ORDERS = 5
PLATEAU, MIN_PLATEAU, CLIFF = 0.9, 0.2, 0.3


def plateau(curve: list[tuple[float, float]]) -> float:
    """The largest pruned fraction up to which the kept share ``m`` stays ≥ ``PLATEAU``."""
    kept = 0.0
    for fraction, m in curve:
        if m < PLATEAU:
            break
        kept = fraction
    return kept


def analyze(out: Path, smoke: bool) -> record.Analysis:
    """Train the config, then prune one head per step by each order.

    The metric is the share of attention's gain kept, ``m = (bigram − loss) / (bigram −
    loss_unpruned)`` (1: unpruned; ≤ 0: no better than the exact bigram model, which needs no
    attention). Verdict rule (declared before measuring): *supported* iff the gradient-
    importance order keeps m ≥ 0.9 up to ≥ 20% of heads pruned (plateau), m then falls by
    ≥ 0.3 within the next 25% (cliff), and its curve's mean m exceeds the random orders' mean;
    *refuted* if neither importance order keeps m ≥ 0.9 at 10% pruned; else *inconclusive*.
    """
    config = load_file(_CONFIG).get_config("smoke" if smoke else None)
    train_and_evaluate(config, out / "train", overwrite=True)
    config, model, _ = load_run(out / "train")
    task = tasks.get(task_name(config.task))
    batch = task.generate(jax.random.key(7), 64 if smoke else 1024, config.task)
    grad_batch = jax.tree.map(lambda x: x[:128], batch)
    bigram = config.task.spec.baselines["bigram_loss"]

    loss = nnx.jit(lambda m: task.loss(m(batch), batch))
    loss0 = float(loss(model))

    def kept(model) -> float:
        return (bigram - float(loss(model))) / (bigram - loss0)

    step = 1 / pruning.get_gates(model).size
    importances = {
        "gradient importance": nnx.jit(
            lambda m: pruning.gradient_importance(m, grad_batch, task.loss)
        ),
        "entropy-redundancy": nnx.jit(lambda m: pruning.entropy_redundancy_importance(m, batch)),
    }
    curves = {name: pruning.pruning_curve(model, kept, fn, step_fraction=step)
              for name, fn in importances.items()}  # fmt: skip
    orders = 1 if smoke else RANDOM_ORDERS
    randoms = [pruning.pruning_curve(model, kept, key=jax.random.key(i), step_fraction=step)
               for i in range(orders)]  # fmt: skip
    curves[f"random (mean of {orders})"] = [
        (f, float(np.mean([r[j][1] for r in randoms]))) for j, (f, _) in enumerate(randoms[0])
    ]
    _plot(curves, out / "summary.png")
    fractions = [f for f, _ in curves["gradient importance"]]
    rows = [[f"{f:.3f}", *(f"{c[j][1]:.3f}" for c in curves.values())]
            for j, f in enumerate(fractions)]  # fmt: skip
    table = markdown_table(["fraction pruned", *curves], rows)
    rows = [{"point": name, "seed": 0, "fraction_pruned": f, "kept_share": m}
            for name, curve in curves.items() for f, m in curve]  # fmt: skip
    return record.analysis("head_pruning", "M2", rows, table, _verdict(curves, loss0, bigram),
                           ["summary.png"])  # fmt: skip


def _verdict(curves: dict, loss0: float, bigram: float) -> tuple[str, str]:
    grad, ent, rand = curves.values()
    p = plateau(grad)
    after = [m for f, m in grad if p < f <= p + 0.25 + 1e-9]
    m_at_p = dict(grad)[p]
    fall = m_at_p - min(after) if after else 0.0
    mean = {name: float(np.mean([m for _, m in c])) for name, c in curves.items()}
    reason = (
        f"unpruned loss {loss0:.3f} nats vs bigram {bigram:.3f}. Plateau (m ≥ {PLATEAU}): "
        f"gradient importance to {p:.0%} pruned, entropy-redundancy to {plateau(ent):.0%}, "
        f"random mean to {plateau(rand):.0%}; after the gradient plateau m falls by {fall:.2f} "
        f"within 25% more heads; mean m over the curve: "
        + ", ".join(f"{n} {v:.2f}" for n, v in mean.items())
        + "."
    )
    if p >= MIN_PLATEAU and fall >= CLIFF and mean[next(iter(mean))] > mean[list(mean)[-1]]:
        return "supported", reason
    if plateau(grad) < 0.1 and plateau(ent) < 0.1:
        return "refuted", reason
    return "inconclusive", reason


def _plot(curves: dict, path: Path) -> None:
    fig, ax = new_figure(figsize=(6.5, 4))
    for name, curve in curves.items():
        ax.plot(*zip(*curve, strict=True), "o-", ms=3, label=name)
    ax.axhline(PLATEAU, color="gray", ls=":", lw=0.8, label=f"plateau threshold {PLATEAU}")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel("kept share m = (bigram − loss) / (bigram − loss₀)")
    ax.set_title("head pruning, order-2 Markov language")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
