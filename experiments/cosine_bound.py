"""CLAIMS S4: cosine attention with a fixed scale g cannot be sharp: the largest weight among n
keys is at most e^{2g}/(e^{2g}+n−1) (0.105 for g = 1, n = 64; the exact bound is unit-tested
with ``attnjax.analysis.cosine_weight_bound``). A learnable scale initialized as in QKNorm
(g₀ = log₂(L²−L)) removes the cap. Tested on a many-key retrieval (impostor task, 64 keys, the
impostor at unit norm, i.e. a plain distractor at cosine 0.5) with one cosine head: scale fixed
at 1, learnable from g₀, and fixed at g₀ (is the scale's size enough, without learning it?)."""

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from attnjax import analysis
from attnjax.analysis import pruning
from attnjax.experiment import (
    Experiment,
    combine,
    load_file,
    load_run,
    record,
    sweep,
    with_overrides,
)
from attnjax.experiment.report import fmt, markdown_table, mean_ci95, new_figure, save_figure
from attnjax.experiment.trainer import get_trainer
from attnjax.nn.scores import qknorm_scale

_CONFIG = Path(__file__).parents[1] / "configs" / "impostor.py"
SEEDS, KEYS = 5, 64
LEARNING_RATES = (1e-3, 3e-3, 1e-2)


def base_config(smoke: bool):
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    task = dataclasses.replace(base.task, num_keys=KEYS, impostor_norm=1.0)
    length = task.spec.seq_len
    return with_overrides(
        dataclasses.replace(base, name="cosine_bound", task=task),
        {"model.score": "cosine", "model.max_len": length},
    )


def points(length: int) -> dict[str, dict]:
    g0 = qknorm_scale(length)
    return {
        "fixed g = 1": {"model.cosine_scale": 1.0},
        f"learnable from g₀ = {g0:.1f}": {"model.cosine_scale": None},
        f"fixed g = g₀ = {g0:.1f}": {"model.cosine_scale": g0},
    }


def query_top_weights(folder: Path, seed: int, learning_rate: float) -> np.ndarray:
    """The largest attention weight of the query (last) row of every test example ``[B]`` for
    the run of ``seed`` at ``learning_rate`` in a point's folder."""
    config, model, _ = load_run(folder, (seed, learning_rate))
    maps = pruning.attention_maps(model, get_trainer(config).eval_batch(seed, "test"))
    return np.asarray(jnp.max(maps[0][:, 0, -1, :], axis=-1))


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Sweep the three points (``SEEDS`` seeds × ``LEARNING_RATES``, accuracy, best rate on
    validation), then read each seed's query-row attention at its point's chosen rate.

    Verdict rule (declared before measuring), two parts. (1) The cap binds: with g fixed at 1
    no test row's top weight exceeds the bound (a violation refutes), and that model's
    accuracy interval lies below the learnable model's (its cap costs accuracy; overlapping
    intervals: unclear). (2) A learnable scale removes the cap: the learnable model's mean
    top weight has a 95% interval (over seeds) above the g = 1 bound (refuted if its upper
    end is at or below it). The claim is supported iff both parts hold, refuted iff either is
    refuted, else inconclusive.
    """
    base = base_config(smoke)
    length = base.task.spec.seq_len
    named = points(length)
    seeds = seeds or (1 if smoke else SEEDS)
    exp = Experiment(
        name="cosine_bound", claim_id="S4", claim=" ".join(__doc__.split()), base=base,
        points=tuple(named.values()), metric="accuracy",
        verdict=lambda summary: ("inconclusive", "judged on the attention weights"),
        learning_rates=LEARNING_RATES[:2] if smoke else LEARNING_RATES,
    )  # fmt: skip
    outcome = sweep(exp, out / "sweep", num_seeds=seeds, overwrite=overwrite)
    rows, top = [], {}
    for (name, point), folder in zip(named.items(), outcome.folders, strict=True):
        stats = outcome.summary[point]
        weights = [query_top_weights(folder, base.train.seed + i, stats.learning_rate)
                   for i in range(seeds)]  # fmt: skip
        top[name] = (mean_ci95([w.mean() for w in weights]), max(w.max() for w in weights))
        for i, (w, acc) in enumerate(zip(weights, stats.values, strict=True)):
            rows.append({"point": name, "seed": base.train.seed + i, "learning_rate":
                         stats.learning_rate, "test_accuracy": acc, "mean_top_weight":
                         float(w.mean()), "max_top_weight": float(w.max())})  # fmt: skip
    bound = float(analysis.cosine_weight_bound(1.0, KEYS))
    _plot(outcome.summary, named, top, bound, out / "summary.png")
    return report_from_rows({"results.csv": rows})


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per point and seed, at the point's
    chosen rate): table, verdict and reason."""
    rows = tables["results.csv"]
    bound = float(analysis.cosine_weight_bound(1.0, KEYS))
    names = list(dict.fromkeys(r["point"] for r in rows))  # fixed g = 1, learnable, fixed g₀
    table, accuracy, top = [], {}, {}
    for name in names:
        group = [r for r in rows if r["point"] == name]
        accuracy[name] = mean_ci95([r["test_accuracy"] for r in group])
        top[name] = mean_ci95([r["mean_top_weight"] for r in group])
        largest = max(r["max_top_weight"] for r in group)
        table.append([name, f"{group[0]['learning_rate']:g}", fmt(*accuracy[name]),
                      fmt(*top[name]), f"{largest:.4f}"])  # fmt: skip
    (fixed, fixed_half), (learnable, learnable_half) = (accuracy[n] for n in names[:2])
    fixed_max = max(r["max_top_weight"] for r in rows if r["point"] == names[0])
    learn_top, learn_half = top[names[1]]
    learn_half = 0.0 if np.isnan(learn_half) else learn_half
    if fixed_max > bound * (1 + 1e-4):
        first = "refuted"
    else:
        upper, lower = fixed + np.nan_to_num(fixed_half), learnable - np.nan_to_num(learnable_half)
        first = "supported" if upper < lower else "inconclusive"
    second = ("supported" if learn_top - learn_half > bound
              else "refuted" if learn_top + learn_half <= bound else "inconclusive")  # fmt: skip
    verdict = combine((first, second))
    reason = (
        f"bound for g = 1, n = {KEYS}: {bound:.4f}; (1) g = 1: largest top weight {fixed_max:.4f}, "
        f"accuracy {fixed:.3f} vs learnable {learnable:.3f} ({first}); (2) learnable "
        f"scale: mean top weight {learn_top:.3f} ± {learn_half:.3f} ({second})."
    )
    body = (
        f"Cosine head over {KEYS} keys; the bound at g = 1 is {bound:.4f}. Accuracy at each "
        f"point's best rate; top weight of the query row, mean over test examples (mean ± 95% "
        f"interval over seeds) and its largest value.\n\n"
        + markdown_table(["point", "lr", "test accuracy", "mean top weight", "largest"], table)
    )
    return record.analysis("cosine_bound", "S4", rows, body, (verdict, reason), ["summary.png"])


def _plot(summary, named: dict, top: dict, bound: float, path: Path) -> None:
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 3.4))
    names = list(named)
    for i, name in enumerate(names):
        (mean, half), _ = top[name]
        ax1.barh(i, mean, xerr=0 if np.isnan(half) else half, capsize=3, color="#8fb3d9")
        s = summary[named[name]]
        ax2.barh(i, s.mean, xerr=s.mean - s.lower, capsize=3, color="#e3a869")
        ax2.plot(s.values, [i] * len(s.values), "k.", ms=3)
    ax1.axvline(bound, color="k", ls="--", lw=1, label=f"bound at g = 1: {bound:.3f}")
    ax1.set_xlabel("query row's top attention weight (mean over examples)")
    ax2.set_xlabel("test accuracy")
    for ax in (ax1, ax2):
        ax.set_yticks(range(len(names)), names if ax is ax1 else [""] * len(names))
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    ax1.legend(fontsize=8)
    save_figure(fig, path, f"cosine attention over {KEYS} keys: fixed vs learnable scale")
