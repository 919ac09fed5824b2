"""CLAIMS M1: identical or zero inputs collapse all heads onto the same (uniform) attention map,
whatever the weights; head-diversity penalties added to the loss (the mean pairwise cosine of
the heads' maps; the orthogonality penalty Σ_{i≠j} ‖A_i A_jᵀ‖²_F) keep the heads apart. Also
measured: what the penalties do to accuracy."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from attnjax import analysis, nn, tasks
from attnjax.analysis.pruning import attention_maps
from attnjax.experiment import (
    Experiment,
    Stats,
    Summary,
    label,
    load_file,
    load_run,
    record,
    sweep,
)
from attnjax.experiment.config import with_overrides
from attnjax.experiment.recompute import NotRecomputable
from attnjax.experiment.report import fmt, markdown_table, mean_ci95, new_figure, save_figure
from attnjax.experiment.sweep import judge, summarize, sweep_report
from attnjax.nn.positional import sinusoidal

_CONFIG = Path(__file__).parents[1] / "configs" / "head_diversity.py"
HEADS, WEIGHTS, SEEDS = (2, 4), (0.1, 1.0), 5
PENALTIES = (("none", 0.0), *((p, w) for p in ("cosine", "orthogonality") for w in WEIGHTS))
INPUTS = ("random", "identical", "zero", "identical + sinusoidal", "identical, RoPE")
XAVIER = nnx.initializers.xavier_uniform()  # the record's initialization (Flax's is LeCun)
COLLAPSED = 0.999  # least similarity and entropy / log S of a collapsed layer
STATS = ("similarity", "query-row similarity", "entropy / log S")
Point = tuple[int, str, float]  # heads, penalty, weight


def head_stats(weights: Float[Array, "B N T S"]) -> dict[str, float]:
    """Mean pairwise cosine of the heads' flattened maps (all rows; the last, query, row only)
    and mean row entropy / log S (1: uniform)."""
    values = (
        analysis.cosine_diversity_penalty(weights),
        analysis.cosine_diversity_penalty(weights[..., -1:, :]),
        analysis.entropy(weights).mean() / jnp.log(weights.shape[-1]),
    )
    return dict(zip(STATS, map(float, values), strict=True))


def module_stats(kind: str, seed: int, heads: int = 4, width: int = 32, length: int = 9):
    """:func:`head_stats` of a freshly initialized ``MultiHeadAttention`` on 64 sequences of
    an ``INPUTS`` kind: N(0, 1) tokens; one N(0, 1) token repeated; zeros; a repeated token
    plus sinusoidal positions; a repeated token with RoPE inside attention."""
    kx, kp = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (64, length, width))
    if kind != "random":
        x = jnp.broadcast_to(x[:, :1], x.shape) * (kind != "zero")
    if kind == "identical + sinusoidal":
        x = x + sinusoidal(jnp.arange(length), width)[None]
    rope = kind.endswith("RoPE")
    mha = nn.MultiHeadAttention(heads, width, rope=rope, kernel_init=XAVIER, rngs=nnx.Rngs(kp))
    return head_stats(mha(x, return_weights=True)[1])


def degenerate(batch: dict, kind: str) -> dict:
    """``batch`` with every token replaced by the first one (``identical``) or by zeros."""
    x = batch["inputs"]
    x = jnp.broadcast_to(x[:, :1], x.shape) if kind == "identical" else jnp.zeros_like(x)
    return batch | {"inputs": x}


def _overrides(point: Point) -> dict:
    heads, penalty, weight = point
    return {"model.heads": heads, "train.diversity": penalty, "train.diversity_weight": weight}


def _apart(stats: dict[Point, Stats]) -> dict[Point, bool]:
    """Whether each penalized point's interval lies below its head count's unpenalized one."""
    return {(h, p, w): s.upper < stats[h, "none", 0.0].lower
            for (h, p, w), s in stats.items() if p != "none"}  # fmt: skip


def verdict(similarity: dict[Point, Stats], degenerate_min: float) -> tuple[str, str]:
    """The rule of :func:`analyze`, from the trained similarity on task inputs and the least
    similarity or entropy / log S of any model on identical or zero inputs."""
    apart = _apart(similarity)
    strongest = max(w for _, _, w in similarity)
    lowered = {p: all(v for (_, q, w), v in apart.items() if (q, w) == (p, strongest))
               for p in ("cosine", "orthogonality")}  # fmt: skip
    collapse = degenerate_min >= COLLAPSED
    reason = (
        f"identical and zero inputs: least similarity or entropy / log S over all models, at "
        f"init and trained, {degenerate_min:.4f}. Trained similarity on task inputs: "
        + "; ".join(f"{label(_overrides(k))} {s.mean:.3f}" for k, s in similarity.items())
        + f". Below the unpenalized interval at weight {strongest:g} for every head count: "
        + ", ".join(f"{p} {'yes' if v else 'no'}" for p, v in lowered.items())
        + "."
    )
    if collapse and all(lowered.values()):
        return "supported", reason
    if not collapse or not any(apart.values()):
        return "refuted", reason
    return "inconclusive", reason


def accuracy_verdict(summary: Summary, points: list[Point]) -> tuple[str, str]:
    """The sweep's secondary rule, on accuracy: a penalty *costs* accuracy if its interval lies
    below the unpenalized one of its head count. *Supported* (no cost) iff no penalized point
    costs; *refuted* iff every one does; else *inconclusive*."""
    costs = _apart({k: summary[_overrides(k)] for k in points})
    reason = (
        "test accuracy: "
        + "; ".join(f"{name} {s.mean:.3f}" for name, s in summary.labels().items())
        + f". Penalized points below the unpenalized interval: {sum(costs.values())} of "
        f"{len(costs)} (the accuracy side, reported beside the M1 verdict)."
    )
    if not any(costs.values()):
        return "supported", reason
    return ("refuted" if all(costs.values()) else "inconclusive"), reason


def _experiment(smoke: bool) -> tuple[Experiment, list[Point]]:
    """The training sweep :func:`analyze` runs, and its points as (heads, penalty, weight)."""
    points = [(h, p, w) for h in ((2,) if smoke else HEADS)
              for p, w in (PENALTIES[::4] if smoke else PENALTIES)]  # fmt: skip
    experiment = Experiment(
        name="head_diversity",
        claim_id="M1 accuracy",
        claim="M1, accuracy side: a head-diversity penalty does not cost accuracy.",
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=tuple(_overrides(k) for k in points),
        metric="accuracy",
        verdict=lambda summary: accuracy_verdict(summary, points),
    )
    return experiment, points


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Heads on degenerate inputs at initialization, then a training sweep (``SEEDS`` seeds,
    vectorized; ``--seeds`` sets another count) of head count × penalty × weight.

    Verdict rule (declared before measuring). *Collapse* holds iff on identical and on zero
    inputs every model (each point and seed, at initialization and trained) has head
    similarity ≥ ``COLLAPSED`` and entropy / log S ≥ ``COLLAPSED``. A penalty *keeps heads
    apart* at a head count if the 95% interval over seeds of the trained similarity on task
    inputs lies below the unpenalized one. *Supported* iff collapse holds and both penalties
    keep heads apart at the largest weight for every head count; *refuted* iff collapse fails
    or no penalized point keeps heads apart; else *inconclusive*. Accuracy is judged separately
    by the sweep's rule (:func:`accuracy_verdict`, in ``report.md``). The positional inputs
    (identical tokens plus sinusoidal or rotary positions) are reported, not judged.
    """
    experiment, points = _experiment(smoke)
    seeds = seeds or (1 if smoke else SEEDS)
    outcome = sweep(experiment, out, num_seeds=seeds, overwrite=overwrite)
    summary = outcome.summary
    base = experiment.base
    seed_range = range(base.train.seed, base.train.seed + seeds)
    init = {}
    for kind in INPUTS:
        stats = [module_stats(kind, s) for s in seed_range]
        init[kind] = {k: float(np.mean([s[k] for s in stats])) for k in STATS}
    task = tasks.get("min_of_keys")
    batches = [task.generate(jax.random.fold_in(jax.random.key(8), s), 64 if smoke else 512,
                             base.task) for s in seed_range]  # fmt: skip
    trained, degenerate_min = {}, 1.0
    for point, folder in zip(points, outcome.folders, strict=True):
        models = [load_run(folder, r)[1] for r in range(seeds)]
        config = with_overrides(base, _overrides(point))
        models_at_init = [nn.build(config.model, nnx.Rngs(s)) for s in seed_range]
        trained[point] = [
            head_stats(attention_maps(m, b)[0]) for m, b in zip(models, batches, strict=True)
        ]
        for m, b in zip(models + models_at_init, batches + batches, strict=True):
            for kind in ("identical", "zero"):
                stats = head_stats(attention_maps(m, degenerate(b, kind))[0])
                degenerate_min = min(degenerate_min, stats["similarity"], stats["entropy / log S"])
    limit = base.task.spec.baselines["single_direction_accuracy"]
    _plot(summary, trained, init, points, limit, out / "head_diversity.png")
    csv_rows = [
        {"point": label(_overrides(k)), "seed": seed} | s for k, v in trained.items()
        for seed, s in zip(seed_range, v, strict=True)
    ] + [{"point": f"init {kind}", "seed": "mean"} | v for kind, v in init.items()] + [
        {"point": DEGENERATE, "seed": "min", LEAST: degenerate_min}
    ]  # fmt: skip
    tables = {"results.csv": record.read_rows(out / "results.csv"), "analysis.csv": csv_rows}
    return report_from_rows(tables, smoke)


DEGENERATE = "identical or zero inputs"  # the row holding the least similarity or entropy
LEAST = "least similarity or entropy / log S"  # over every model, at init and trained


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from the sweep's ``results.csv`` and its own
    ``analysis.csv``: tables, both verdicts and their reasons."""
    rows = tables["analysis.csv"]
    least = [r[LEAST] for r in rows if r["point"] == DEGENERATE]
    if not least:
        raise NotRecomputable(f"analysis.csv has no {DEGENERATE!r} row ({LEAST})")
    experiment, points = _experiment(smoke)
    summary, _ = summarize(experiment, tables["results.csv"])
    accuracy, accuracy_reason = judge(experiment, summary)
    num_seeds = len(next(iter(summary))[1].values)
    trained = {k: [{n: r[n] for n in STATS} for r in rows if r["point"] == label(_overrides(k))]
               for k in points}  # fmt: skip
    init = {r["point"].removeprefix("init "): {n: r[n] for n in STATS} for r in rows
            if r["point"].startswith("init ")}  # fmt: skip
    similarity = {k: _stats([s["similarity"] for s in v]) for k, v in trained.items()}
    table_rows = [[label(_overrides(k)), fmt(summary[_overrides(k)].mean,
                                             summary[_overrides(k)].half_width),
                   *(fmt(*mean_ci95([s[name] for s in v])) for name in STATS)]
                  for k, v in trained.items()]  # fmt: skip
    table = (
        markdown_table(["point", "test accuracy", *STATS], table_rows)
        + "\n"
        + markdown_table(
            ["inputs (fresh MultiHeadAttention, 4 heads)", *STATS],
            [[kind, *(f"{v[k]:.4f}" for k in STATS)] for kind, v in init.items()],
        )
    )
    body = sweep_report(experiment, summary, accuracy, accuracy_reason, num_seeds)
    return record.analysis(
        "head_diversity", "M1", rows, f"{table}\n{body}", verdict(similarity, least[0]),
        ["head_diversity.png"], csv_name="analysis.csv",
    )  # fmt: skip


def _stats(values: list[float]) -> Stats:
    return Stats(*mean_ci95(values), tuple(values), float("nan"), 0)


def _plot(
    summary: Summary, trained: dict, init: dict, points: list[Point], limit: float, path: Path
) -> None:
    fig, axes = new_figure(1, 3, figsize=(15, 4.2))
    names = [label(_overrides(k)).replace("diversity_weight=", "w=") for k in points]
    y = np.arange(len(points))
    for ax, values, xlabel in (
        (axes[0], [[s["similarity"] for s in trained[k]] for k in points],
         "head similarity on task inputs\n(mean pairwise cosine of the maps)"),
        (axes[1], [summary[_overrides(k)].values for k in points], "test accuracy"),
    ):  # fmt: skip
        errors = [0 if len(v) < 2 else mean_ci95(v)[1] for v in values]
        ax.errorbar([np.mean(v) for v in values], y, xerr=errors, fmt="o", capsize=3,
                    label="mean ± 95% CI")  # fmt: skip
        for i, v in enumerate(values):
            ax.plot(v, [i] * len(v), "k.", ms=3, label="seeds" if i == 0 else None)
        ax.set_yticks(y, names if ax is axes[0] else [], fontsize=7)
        ax.set_ylim(len(points) - 0.5, -0.5)
        ax.set_xlabel(xlabel)
    axes[1].axvline(limit, color="gray", ls="--", lw=1,
                    label=f"single-direction limit {limit:.3f}")  # fmt: skip
    for j, name in enumerate(("similarity", "entropy / log S")):
        axes[2].bar(np.arange(len(INPUTS)) + 0.4 * j, [init[k][name] for k in INPUTS], 0.4,
                    label=name)  # fmt: skip
    axes[2].set_xticks(np.arange(len(INPUTS)) + 0.2, INPUTS, rotation=20, fontsize=7)
    axes[2].set_ylabel("value at initialization (mean over seeds)")
    axes[2].set_title("fresh 4-head attention by input kind", fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, "head diversity on min-of-keys (1 layer, MLP, no LayerNorm)")
