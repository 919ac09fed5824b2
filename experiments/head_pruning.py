"""CLAIMS M2: many heads of a trained multi-head model can be pruned with little loss, then
performance falls off a cliff (Michel et al., 2019; Voita et al., 2019); the order comes from
head importance I_h = E|∂L/∂ξ_h| for the head gates ξ, or from entropy and redundancy."""

import functools
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from attnjax import tasks
from attnjax.analysis import pruning
from attnjax.experiment import load_file, load_run, record, train_and_evaluate
from attnjax.experiment.config import task_name
from attnjax.experiment.recompute import NotRecomputable
from attnjax.experiment.report import markdown_table, new_figure, save_figure

_CONFIG = Path(__file__).parents[1] / "configs" / "head_pruning.py"
RANDOM_ORDERS, SEEDS = 5, 5
PLATEAU, MIN_PLATEAU, CLIFF = 0.9, 0.2, 0.3


def plateau(curve: list[tuple[float, float]]) -> float:
    """The largest pruned fraction up to which the kept share ``m`` stays ≥ ``PLATEAU``."""
    kept = 0.0
    for fraction, m in curve:
        if m < PLATEAU:
            break
        kept = fraction
    return kept


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train the config for ``SEEDS`` seeds, then prune each seed's model one head per step by
    each order: importances measured on one batch, the loss on another (both drawn per seed).

    The metric is the share of attention's gain kept, ``m = (bigram − loss) / (bigram −
    loss_unpruned)`` (1: unpruned; ≤ 0: no better than the exact bigram model, which needs no
    attention), averaged over seeds at each pruned fraction. Verdict rule (declared before
    measuring), on the seed-mean curves: *supported* iff the gradient-importance order keeps
    m ≥ 0.9 up to ≥ 20% of heads pruned (plateau), m then falls by ≥ 0.3 within the next 25%
    (cliff), and its curve's mean m exceeds the random orders' mean; *refuted* if neither
    importance order keeps m ≥ 0.9 at 10% pruned; else *inconclusive*.
    """
    config = load_file(_CONFIG).get_config("smoke" if smoke else None)
    default, size = (1, 64) if smoke else (SEEDS, 1024)
    seeds = seeds or default
    train_and_evaluate(config, out / "train", num_seeds=seeds, overwrite=overwrite)
    task = tasks.get(task_name(config.task))
    bigram = config.task.spec.baselines["bigram_loss"]
    loss = nnx.jit(lambda m, b: task.loss(m(b), b))
    importances = {
        "gradient importance": nnx.jit(lambda m, b: pruning.gradient_importance(m, b, task.loss)),
        "entropy-redundancy": nnx.jit(lambda m, b: pruning.entropy_redundancy_importance(m, b)),
    }
    orders = 1 if smoke else RANDOM_ORDERS
    random_name = f"random (mean of {orders})"
    per_seed, losses0 = [], []
    for r, seed in enumerate(range(config.train.seed, config.train.seed + seeds)):
        model = load_run(out / "train", r)[1]
        measure, evaluate = (
            task.generate(jax.random.fold_in(jax.random.key(stream), seed), n, config.task)
            for stream, n in ((6, 128), (7, size))
        )
        loss0 = float(loss(model, evaluate))
        losses0.append(loss0)

        def kept(m, evaluate=evaluate, loss0=loss0) -> float:
            return (bigram - float(loss(m, evaluate))) / (bigram - loss0)

        step = 1 / pruning.get_gates(model).size
        curves = {
            name: pruning.pruning_curve(
                model, kept, functools.partial(fn, b=measure), step_fraction=step
            )
            for name, fn in importances.items()
        }
        randoms = [pruning.pruning_curve(model, kept, key=jax.random.key(seed * orders + i),
                                         step_fraction=step) for i in range(orders)]  # fmt: skip
        curves[random_name] = _mean_curve(randoms)
        per_seed.append(curves)
    rows = [{"point": name, "seed": config.train.seed + r, "fraction_pruned": f, "kept_share": m}
            for r, c in enumerate(per_seed) for name, curve in c.items()
            for f, m in curve]  # fmt: skip
    rows += [{"point": UNPRUNED, "seed": config.train.seed + r, "loss": loss0}
             for r, loss0 in enumerate(losses0)]  # fmt: skip
    analysis, curves = _report(rows, bigram)
    _plot(curves, out / "summary.png")
    return analysis


UNPRUNED = "unpruned"  # the rows holding each seed's unpruned test loss


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows (each order's kept share by seed and pruned
    fraction, and each seed's unpruned loss): table, verdict and reason."""
    rows = tables["results.csv"]
    if not any(r["point"] == UNPRUNED for r in rows):
        raise NotRecomputable(f"results.csv has no {UNPRUNED!r} rows (each seed's unpruned loss)")
    bigram = load_file(_CONFIG).get_config(None).task.spec.baselines["bigram_loss"]
    return _report(rows, bigram)[0]


def _report(rows: list[dict], bigram: float) -> tuple[record.Analysis, dict]:
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    names = list(dict.fromkeys(r["point"] for r in rows if r["point"] != UNPRUNED))
    per_seed = [{n: [(r["fraction_pruned"], r["kept_share"]) for r in rows
                     if (r["seed"], r["point"]) == (s, n)] for n in names}
                for s in seeds]  # fmt: skip
    curves = {name: _mean_curve([c[name] for c in per_seed]) for name in names}
    fractions = [f for f, _ in curves["gradient importance"]]
    table_rows = [[f"{f:.3f}", *(f"{c[j][1]:.3f}" for c in curves.values())]
                  for j, f in enumerate(fractions)]  # fmt: skip
    table = f"Kept share m, mean over {len(seeds)} seeds:\n\n" + markdown_table(
        ["fraction pruned", *curves], table_rows
    )
    plateaus = ", ".join(f"{plateau(c['gradient importance']):.0%}" for c in per_seed)
    loss0 = float(np.mean([r["loss"] for r in rows if r["point"] == UNPRUNED]))
    verdict, reason = _verdict(curves, loss0, bigram)
    reason += f" Gradient-importance plateau per seed: {plateaus}."
    analysis = record.analysis(
        "head_pruning", "M2", rows, table, (verdict, reason), ["summary.png"]
    )
    return analysis, curves


def _mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The pointwise mean of curves sampled at the same fractions."""
    return [(f, float(np.mean([c[j][1] for c in curves]))) for j, (f, _) in enumerate(curves[0])]


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
