"""CLAIMS S8: additive attention vᵀ act(W_q q + W_k k + b) without a bias can cancel on
symmetric inputs into near-uniform attention, and a learnable bias fixes it; the bias keeps
tanh in its active range; with ReLU instead of tanh some hidden units are dead (never positive),
and a positive bias helps.

Without a bias, tanh's score is odd in (q, k): the mirrored example (-q, -K) gets exactly the
negated scores, so on a sign-symmetric retrieval task the key ranked first for one example is
ranked last for its mirror, and the two cancel in training."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from attnjax import analysis, nn, tasks
from attnjax.experiment import (
    Experiment,
    ExperimentConfig,
    OptimConfig,
    Summary,
    TrainConfig,
    combine,
    label,
    load_run,
    record,
    sweep,
)
from attnjax.experiment.config import with_overrides
from attnjax.experiment.report import fmt, markdown_table, new_figure, save_figure
from attnjax.experiment.sweep import point_key, summarize, sweep_tables
from attnjax.experiment.trainer import INIT, get_trainer
from attnjax.nn.config import register
from attnjax.nn.scores import make_score

SEEDS, DIM, NUM_KEYS, HIDDEN = 5, 8, 8, 32
OFFSET = 3.0  # added to every input coordinate: tanh's pre-activations start off-centre
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
UNIFORM, NOT_UNIFORM = 0.9, 0.8  # init entropy / log S: near uniform at or above; clearly not below
EFFECT = 0.05  # saturated or dead fraction
DEAD = 0.05  # per-query dead fraction of ReLU without a bias: dead units exist at or above
STATS = ("entropy / log S", "saturated", "dead per query", "dead everywhere")


def _point(score: str, bias: float | None, offset: float = 0.0) -> dict:
    """Overrides of one point: ``bias`` None (no b) or b's initial value (learnable)."""
    fields = {"model.score": score, "model.score_bias": bias is not None, "task.offset": offset}
    return fields | {"model.score_bias_init": 0.0 if bias is None else bias}


TANH_NONE, TANH_BIAS = _point("additive", None), _point("additive", 0.0)
OFFSET_NONE, OFFSET_BIAS = _point("additive", None, OFFSET), _point("additive", 0.0, OFFSET)
RELU_NONE, RELU_ZERO, RELU_PLUS = (_point("additive_relu", b) for b in (None, 0.0, 1.0))
POINTS = (TANH_NONE, TANH_BIAS, OFFSET_NONE, OFFSET_BIAS, RELU_NONE, RELU_ZERO, RELU_PLUS)


@register("additive_retrieval")
class AdditiveRetrieval(nnx.Module):
    """Bahdanau-style retrieval on the impostor task's tokens ``[B, S + 1, D + 1 + V]``: the
    last token's vector ``q [B, 1, 1, D]`` attends over the keys' vectors ``k [B, 1, S, D]``
    with the config's additive score (its ``b`` the only bias before the softmax), and a
    linear readout maps the weighted mixture of the keys' one-hot values ``[B, V]`` to logits,
    repeated at every position (the task scores the last)."""

    def __init__(self, config: nn.ModelConfig, *, rngs: nnx.Rngs):
        self.dim = config.in_features - 1 - config.num_classes
        self.score = make_score(config.score, 1, self.dim, options=config.score_options(),
                                rngs=rngs)  # fmt: skip
        self.readout = nnx.Linear(config.num_classes, config.num_classes, rngs=rngs)

    def split(self, inputs: Float[Array, "B T F"]) -> tuple[Array, Array, Array]:
        """``q [B, 1, 1, D]``, ``k [B, 1, S, D]`` and the keys' one-hot values ``[B, S, V]``."""
        d = self.dim
        return inputs[:, None, -1:, :d], inputs[:, None, :-1, :d], inputs[:, :-1, d + 1 :]

    def __call__(self, batch: dict) -> Float[Array, "B T C"]:
        q, k, values = self.split(batch["inputs"])
        weights = jax.nn.softmax(self.score.logits(q, k), axis=-1)[:, 0, 0]  # [B, S]
        logits = self.readout(jnp.einsum("bs,bsv->bv", weights, values))
        return jnp.broadcast_to(logits[:, None], (*values.shape[:1], values.shape[1] + 1,
                                                  logits.shape[-1]))  # fmt: skip


def hidden_stats(model: AdditiveRetrieval, batch: dict) -> dict[str, float]:
    """On ``batch``: mean attention entropy / log S; the fraction of hidden pre-activations
    ``W_qᵀ q + W_kᵀ k + b`` (one per query, key and unit) with ``|·| > 2`` (tanh' < 0.07);
    the fraction of (query, unit) pairs with every key's pre-activation ≤ 0 (dead for that
    query under ReLU); the fraction of units ≤ 0 for every query and key."""
    q, k, _ = model.split(batch["inputs"])
    p = model.score()
    pre = q @ p["w_q"] + k @ p["w_k"]  # [B, 1, S, A]
    pre = pre + jax.lax.broadcast_to_rank(p.get("b", jnp.zeros(())), pre.ndim)
    weights = jax.nn.softmax(model.score.logits(q, k), axis=-1)
    off = pre <= 0
    values = (
        analysis.entropy(weights).mean() / jnp.log(k.shape[2]),
        (jnp.abs(pre) > 2).mean(),
        off.all(axis=2).mean(),
        off.all(axis=(0, 1, 2)).mean(),
    )
    return dict(zip(STATS, map(float, values), strict=True))


def base_config(smoke: bool) -> ExperimentConfig:
    """Impostor task without an impostor cue (norm 1: one more key at cosine 0.5), D = 8,
    8 keys; additive score with A = 32 hidden units."""
    task = tasks.get("impostor").config(dim=DIM, num_keys=NUM_KEYS, impostor_norm=1.0)
    return ExperimentConfig(
        name="activation",
        task=task,
        model=dict(kind="additive_retrieval", score="additive", score_hidden=HIDDEN),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=20 if smoke else 1500,
            eval_every=10 if smoke else 500,
            batch_size=128,
            eval_batch_size=64 if smoke else 2048,
        ),
    )


def verdict(summary: Summary, init: dict, trained: dict) -> tuple[str, str]:
    """The rule of :func:`analyze`; ``init`` and ``trained`` map :func:`point_key` to the
    seed-mean :data:`STATS`."""

    def stat(stats, point, name):
        return stats[point_key(point)][name]

    def part(holds: bool, contradicted: bool) -> str:
        return "refuted" if contradicted else "supported" if holds else "inconclusive"

    none, bias = summary[TANH_NONE], summary[TANH_BIAS]
    entropy0 = stat(init, TANH_NONE, "entropy / log S")
    sat_none, sat_bias = (stat(trained, p, "saturated") for p in (OFFSET_NONE, OFFSET_BIAS))
    dead_none, dead_plus = (stat(trained, p, "dead per query") for p in (RELU_NONE, RELU_PLUS))
    relu, plus = summary[RELU_NONE], summary[RELU_PLUS]
    parts = {
        "(a) cancel → uniform, bias fixes": part(
            entropy0 >= UNIFORM and bias.lower > none.upper,
            entropy0 < NOT_UNIFORM or bias.mean <= none.mean,
        ),
        "(b) bias keeps tanh active": part(sat_bias < sat_none - EFFECT, sat_bias >= sat_none),
        "(c) ReLU dead units, +1 helps": part(
            dead_none >= DEAD and dead_plus < dead_none - EFFECT and plus.mean >= relu.mean,
            dead_none < DEAD / 5 or dead_plus >= dead_none or plus.upper < relu.lower,
        ),
    }
    reason = (
        f"(a) centred inputs, tanh: entropy / log S at init without a bias {entropy0:.3f}; "
        f"test accuracy without a bias {fmt(none.mean, none.half_width)}, learnable bias "
        f"{fmt(bias.mean, bias.half_width)}. (b) offset {OFFSET:g}, tanh, trained saturated "
        f"fraction without a bias {sat_none:.3f}, learnable bias {sat_bias:.3f} "
        f"(init {stat(init, OFFSET_NONE, 'saturated'):.3f}). (c) ReLU, trained dead-per-query "
        f"fraction without a bias {dead_none:.3f}, bias init +1 {dead_plus:.3f} "
        f"(zero-init bias {stat(trained, RELU_ZERO, 'dead per query'):.3f}); test accuracy "
        f"{fmt(relu.mean, relu.half_width)} vs {fmt(plus.mean, plus.half_width)}. Parts: "
        + "; ".join(f"{k}: {v}" for k, v in parts.items())
        + "."
    )
    return combine(parts.values()), reason


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train every point for ``SEEDS`` seeds × ``LEARNING_RATES`` (``--seeds`` sets
    another count), each point at its best rate on validation accuracy; measure
    :func:`hidden_stats` on each seed's test batch at initialization and after training.

    Verdict rule (declared before the full run; S = 8 keys). Each part *holds* (supported), is
    *contradicted* (refuted) or is *unclear* (inconclusive):
    (a) centred inputs, tanh: holds iff without a bias the init entropy / log S ≥ ``UNIFORM``
    and the learnable bias's test-accuracy interval lies above the no-bias one; contradicted
    iff that entropy < ``NOT_UNIFORM`` or the bias's mean accuracy ≤ the no-bias mean.
    (b) inputs offset by ``OFFSET``, tanh: holds iff the trained saturated fraction with the
    learnable bias is below the no-bias one by > ``EFFECT``; contradicted iff it is not below.
    (c) centred inputs, ReLU: holds iff the trained dead-per-query fraction without a bias is
    ≥ ``DEAD``, the +1-initialized learnable bias lowers it by > ``EFFECT`` and its mean test
    accuracy is ≥ the no-bias one; contradicted iff the no-bias fraction is < ``DEAD``/5, or
    +1 does not lower it, or +1's accuracy interval lies below the no-bias one.
    *Supported* iff all parts hold, *refuted* iff any is contradicted, else *inconclusive*.
    No pilot informed the rule: only a smoke run (20 steps) preceded the first full run.
    """
    experiment = _experiment(smoke)
    base, seeds = experiment.base, seeds or (1 if smoke else SEEDS)
    outcome = sweep(experiment, out, num_seeds=seeds, overwrite=overwrite)
    summary = outcome.summary
    seed_range = range(base.train.seed, base.train.seed + seeds)
    rows = []
    for point, folder in zip(POINTS, outcome.folders, strict=True):
        config = with_overrides(base, point)
        batches = [get_trainer(config).eval_batch(s, "test") for s in seed_range]
        lr = summary[point].learning_rate
        per_seed = {
            "init": [hidden_stats(nn.build(config.model, nnx.Rngs(jax.random.fold_in(
                jax.random.key(s), INIT))), b) for s, b in zip(seed_range, batches, strict=True)],
            "trained": [hidden_stats(load_run(folder, (s, lr))[1], b)
                        for s, b in zip(seed_range, batches, strict=True)],
        }  # fmt: skip
        rows += [
            {"point": label(point), "seed": s, "test_accuracy": summary[point].values[r]}
            | {f"{when} {k}": per_seed[when][r][k] for when in per_seed for k in STATS}
            for r, s in enumerate(seed_range)
        ]
    init, trained = seed_means(rows)
    _plot(summary, init, trained, out / "activation.png")
    tables = {"results.csv": record.read_rows(out / "results.csv"), "analysis.csv": rows}
    return report_from_rows(tables, smoke)


def _experiment(smoke: bool) -> Experiment:
    """The training sweep :func:`analyze` runs (judged on the measurements, not by it)."""
    return Experiment(
        name="activation", claim_id="S8", claim=" ".join(__doc__.split()),
        base=base_config(smoke), points=POINTS, metric="accuracy",
        verdict=lambda s: ("inconclusive", "see analysis"), learning_rates=LEARNING_RATES,
    )  # fmt: skip


def seed_means(rows: list[dict]) -> tuple[dict, dict]:
    """``(init, trained)``: each point's seed-mean :data:`STATS` at initialization and after
    training, by :func:`point_key`, from the analysis rows (one per point and seed)."""
    means = []
    for when in ("init", "trained"):
        means.append({point_key(p): {k: float(np.mean([r[f"{when} {k}"] for r in rows
                                                        if r["point"] == label(p)]))
                                     for k in STATS} for p in POINTS})  # fmt: skip
    return means[0], means[1]


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from the sweep's ``results.csv`` and its own
    ``analysis.csv``: tables, verdict and reason."""
    experiment = _experiment(smoke)
    summary, _ = summarize(experiment, tables["results.csv"])
    init, trained = seed_means(tables["analysis.csv"])
    header = ["point", "test accuracy", *(f"{k} (init)" for k in STATS), *STATS]
    table_rows = [[label(p), fmt(s.mean, s.half_width),
                   *(f"{init[point_key(p)][k]:.3f}" for k in STATS),
                   *(f"{trained[point_key(p)][k]:.3f}" for k in STATS)]
                  for p, s in summary]  # fmt: skip
    table = "\n".join([sweep_tables(experiment, summary), markdown_table(header, table_rows)])
    return record.analysis(
        "activation", "S8", tables["analysis.csv"], table, verdict(summary, init, trained),
        ["summary.png", "activation.png"], csv_name="analysis.csv",
    )  # fmt: skip


def _plot(summary: Summary, init: dict, trained: dict, path: Path) -> None:
    fig, axes = new_figure(1, 4, figsize=(17, 4))
    names = [label(p) for p in POINTS]
    y = np.arange(len(POINTS))
    stats = [summary[p] for p in POINTS]
    axes[0].barh(y, [s.mean for s in stats], xerr=[s.half_width for s in stats], color="#8fb3d9")
    axes[0].set_xlabel("test accuracy (mean ± 95% CI)")
    for ax, name in zip(axes[1:], STATS[:3], strict=True):
        for stats_, when, dy in ((init, "init", -0.15), (trained, "trained", 0.15)):
            ax.barh(y + dy, [stats_[point_key(p)][name] for p in POINTS], height=0.3, label=when)
        ax.set_xlabel(name)
        ax.legend(fontsize=7)
    for ax in axes:
        ax.set_yticks(y, names if ax is axes[0] else [""] * len(y), fontsize=7)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path, f"additive retrieval, D = {DIM}, A = {HIDDEN}, {NUM_KEYS} keys")
