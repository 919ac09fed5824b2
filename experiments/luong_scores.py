"""CLAIMS S3: Luong et al. (2015) found the plain dot score at least as good as the "general"
bilinear score for global attention (18.6 vs 17.3 BLEU); a counterweight: which wins is
task-specific. Tested as Luong scored: the recurrent hidden states themselves, with no query or
key projections, and his pair of scores. Two LSTM layers read the same input, as his encoder
and decoder: the encoder's states h̄_s are keys and values, the decoder's h_t queries; global
attention over s ≤ t (both states have seen only x_≤t) gives c_t; h̃_t = tanh(W_c [c_t; h_t])
feeds the readout. The two points differ only in the score: dot h_tᵀh̄_s, unscaled as Luong's,
or general h_tᵀ W h̄_s with W learned from W = I, so for a seed both models are the same
function at step 0 (same draws, same batches) and differ only in that general trains W. Two
tasks, declared with their reasons before any run: copy (an alignment by position, as a
translation aligns target to source words) and associative recall (mqar; an alignment by
content). Each point at the best rate of its grid (chosen on validation), judged on the test
loss, paired by seed id, with an equivalence margin δ of 2% of the task's chance-level loss;
per task dot, general, tie, undetermined, or not converged (a guard: either point's validation
loss, averaged over seeds at its chosen rate, fell by more than δ over the last quarter of
training), combined into a verdict that can be supported, refuted or inconclusive
("task-specific" when the tasks disagree; a tie on every task is inconclusive, since "dot ≥
general" is read as Luong's advantage for dot reproduced).

Declared after a first pilot (seeds 100-103, old model) and before the record: that pilot had
one LSTM scoring its own states with scaled dot against general from I/√D at 600 steps; its
dot was capped by the 1/√D scale on bounded states (mqar stuck at the ln 4 bag-of-values
plateau), one stream made dot's score a symmetric Gram kernel, and dot was still falling at
600 steps. Hence Luong's unscaled dot and W₀ = I, two LSTMs, the convergence guard, and a
second pilot of this model (seeds 200-202, rates 0.01 and 0.03, 1600 steps): on copy both
scores reach the floor (test loss 0.000, accuracy 1.000) by step 400 on every seed, so copy
trains 600 steps; on mqar general is flat by step 600 (0.03-0.05) while dot sits near the ln 4
plateau (1.45-1.50) until a seed escapes it at a random step (one of three by 1600 at each
rate), so mqar trains 1200 steps (the guard's drop there: 0.050 for dot, -0.016 for general),
a budget under which a late escape is reported as not converged, never as a win. Paired sd of
dot − general in that pilot: copy 0.0001, mqar 0.75 (d = 0.14, 1.44, 1.43); at the declared
effect 2δ, `seeds_needed` gives 2 (copy) and 182 (mqar), so mqar's power at 2δ is low (0.11
at 6 seeds) and only an effect near the pilot's (≈ 1 nat; 6 seeds for 80% power) can be
resolved. The budget (about 12 minutes alone on 2 cores, measured from the pilot's CPU time:
5.8 ms per run-step) allows 5 seeds: SEEDS = 5. The start grid drops 1e-3 and 3e-3 (never
chosen in either pilot); AutoRates extends it while a best rate is at an edge.
"""

import dataclasses
import math
from pathlib import Path
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

import attnjax
from attnjax import tasks
from attnjax.experiment import (
    Check,
    Experiment,
    ExperimentConfig,
    OptimConfig,
    Summary,
    TrainConfig,
    record,
    storage,
    sweep,
)
from attnjax.experiment.parts import checks_text, run_checks
from attnjax.experiment.rates import AutoRates
from attnjax.experiment.recompute import Differs
from attnjax.experiment.record import read_rows
from attnjax.experiment.report import fmt, markdown_table, new_figure, save_figure
from attnjax.experiment.stats import equivalent, paired_lower, paired_upper
from attnjax.experiment.sweep import labels, summarize, sweep_tables
from attnjax.nn.config import ModelConfig, register
from attnjax.nn.models import Batch, InputEmbedding, check_batch, readout

SEEDS = 5  # record seeds 0-4 (the budget, see the docstring)
STEPS = {"copy": 600, "mqar": 1200}  # set by the second pilot (see the docstring)
PILOT_SEEDS = (100, 101, 102, 103, 200, 201, 202)  # first pilot (old model), second pilot
RATES = AutoRates((1e-2, 3e-2), factor=3.0, bounds=(1e-4, 0.3))
DRAWS = 1000  # seed-bootstrap draws of the verdict (reported)
FRAGILE_BELOW = 0.9  # bootstrap agreement under which the verdict is reported fragile
MARGIN = 0.02  # equivalence margin: this fraction of the task's chance-level loss ln(1/chance)
DOT, GENERAL = {"model.score": "dot"}, {"model.score": "bilinear"}
# The declared tasks, sized as configs/copy.py and configs/mqar.py (fixed before any run):
TASKS = {
    "copy": dict(length=8, distance=24, num_symbols=8),  # alignment by position
    "mqar": dict(vocab_size=64, seq_len=32, num_pairs=4),  # alignment by content
}
NUM_PAIRS = TASKS["mqar"]["num_pairs"]


@register("luong")
class GlobalAttentionLstm(nnx.Module):
    """Luong et al.'s global attention with two LSTM layers reading the same input, as his
    encoder and decoder: keys and values ``h̄ = encoder(embed(x)) [B, T, D]``, queries
    ``h = decoder(embed(x)) [B, T, D]``; ``c_t = Σ_{s≤t} softmax_s(score(h_t, h̄_s)) h̄_s`` (no
    query, key or value projections); ``h̃_t = tanh(W_c [c_t; h_t])``; logits
    ``readout(h̃_t) [B, T, C]``. ``config.score``: ``dot`` (unscaled, Luong's) or ``bilinear``
    with ``w [1, D, D]`` initialized to ``I`` (created last and drawing nothing, so both scores
    build every other parameter from the same draws)."""

    batch_keys: ClassVar[tuple[str, ...]] = ("inputs",)

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.score not in ("dot", "bilinear"):
            raise ValueError(f"score: expected 'dot' or 'bilinear', got {config.score!r}")
        d, kw = config.width, {**config.dtypes(), "rngs": rngs}
        self.score = config.score
        self.embed = InputEmbedding(config, rngs=rngs)
        self.encoder = nnx.RNN(nnx.OptimizedLSTMCell(d, d, **kw), rngs=False)
        self.decoder = nnx.RNN(nnx.OptimizedLSTMCell(d, d, **kw), rngs=False)
        self.combine = nnx.Linear(2 * d, d, **kw)
        self.readout = readout(config, rngs)
        eye = jnp.eye(d, dtype=config.dtypes()["param_dtype"])[None]
        self.w = nnx.Param(eye) if config.score == "bilinear" else None

    def __call__(self, batch: Batch) -> Float[Array, "B T C"]:
        check_batch(self, batch)
        x = self.embed(batch["inputs"])
        zeros = jnp.zeros((*x.shape[:-2], x.shape[-1]), x.dtype)
        keys = self.encoder(x, initial_carry=(zeros, zeros))
        queries = self.decoder(x, initial_carry=(zeros, zeros))
        context = self.context(queries, keys)
        attended = jnp.tanh(self.combine(jnp.concatenate([context, queries], axis=-1)))
        return self.readout(attended).astype(jnp.float32)

    def context(
        self, queries: Float[Array, "B T D"], keys: Float[Array, "B T D"]
    ) -> Float[Array, "B T D"]:
        """``c_t``: one head over the encoder states ``s ≤ t`` (keys and values) for the
        decoder state ``t`` (query), with no projections."""
        params = None if self.w is None else {"w": self.w[...]}
        q, k = queries[:, :, None, :], keys[:, :, None, :]
        return attnjax.attention(q, k, k, score=self.score, score_params=params,
                                 is_causal=True)[:, :, 0]  # fmt: skip


def base_config(task: str, smoke: bool = False) -> ExperimentConfig:
    """The task's config: width 32, ``STEPS[task]`` steps of batch 64 (evaluated every eighth,
    so the guard's ¾ point is evaluated), Adam at the grid's rates."""
    steps = 16 if smoke else STEPS[task]
    return ExperimentConfig(
        name=f"luong_scores_{task}",
        task=tasks.get(task).config(**TASKS[task]),
        model=dict(kind="luong", width=32, cell="lstm", score="dot"),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=steps,
            eval_every=steps // 8,
            batch_size=64,
            eval_batch_size=32 if smoke else 1024,
            fast_compile=smoke,
        ),
    )


def margin(task: str) -> float:
    """The equivalence margin of ``task``: ``MARGIN · ln(1/chance accuracy)`` nats."""
    return MARGIN * chance_loss(task)


def chance_loss(task: str) -> float:
    """``ln(1/chance accuracy)``: the loss of a uniform guess over the task's target classes."""
    return math.log(1 / tasks.get(task).config(**TASKS[task]).spec.chance_accuracy)


def same_at_init(task: str = "copy", seed: int = 0) -> bool:
    """Both scores give the same logits at step 0 for one seed's parameters and inputs."""
    config = base_config(task, smoke=True)
    batch = tasks.get(task).generate(jax.random.key(seed), 4, config.task)
    outs = []
    for point in (DOT, GENERAL):
        model_config = dataclasses.replace(config.model, score=point["model.score"])
        model = GlobalAttentionLstm(model_config, rngs=nnx.Rngs(seed))
        outs.append(model({"inputs": batch["inputs"]}))
    return bool(jnp.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6))


CHECKS = (Check("dot and general are the same function at step 0 (W₀ = I)", same_at_init),)


class Paired(NamedTuple):
    """One task's per-seed values at each point's chosen rate, paired by seed (sorted): test
    losses ``dot``, ``general`` and each point's validation-loss drop over the last quarter of
    training (``valid_loss_at_3q − valid_loss``) ``dot_drop``, ``general_drop``."""

    seeds: tuple[int, ...]
    dot: np.ndarray
    general: np.ndarray
    dot_drop: np.ndarray
    general_drop: np.ndarray

    def take(self, index: np.ndarray) -> "Paired":
        """The seeds at ``index`` (a bootstrap draw)."""
        return Paired(tuple(self.seeds[i] for i in index),
                      *(a[index] for a in (self.dot, self.general, self.dot_drop,
                                           self.general_drop)))  # fmt: skip


def paired(rows: list[dict], point_rates: dict[str, float]) -> Paired:
    """The :class:`Paired` values of one task's rows at each point's chosen rate
    ``point_rates`` (``{point label: rate}``); a ``Differs`` unless both points hold the same
    seeds, once each."""
    by_point = []
    for name, rate in point_rates.items():
        chosen = {}
        for r in rows:
            if r["point"] == name and r["learning_rate"] == rate:
                if r["seed"] in chosen:
                    raise Differs(f"results.csv: seed {r['seed']} twice for {name} at lr {rate}")
                chosen[r["seed"]] = r
        by_point.append(chosen)
    if set(by_point[0]) != set(by_point[1]):
        raise Differs(f"results.csv: the points hold other seeds: {sorted(by_point[0])} and "
                      f"{sorted(by_point[1])}")  # fmt: skip
    seeds = tuple(sorted(by_point[0]))

    def column(chosen: dict, key) -> np.ndarray:
        return np.array([key(chosen[s]) for s in seeds], float)

    test = [column(c, lambda r: r["test_loss"]) for c in by_point]
    drop = [column(c, lambda r: r["valid_loss_at_3q"] - r["valid_loss"]) for c in by_point]
    return Paired(seeds, *test, *drop)


def outcome(values: Paired, delta: float) -> str:
    """One task: ``"not converged"`` if either point's validation loss, averaged over seeds,
    fell by more than ``delta`` over the last quarter of training; else ``"tie"`` if the paired
    mean of dot − general (test loss, per seed) lies within ±``delta`` (two one-sided 95%
    tests); else ``"dot"`` if its one-sided 95% upper bound is below 0 (dot's loss lower),
    ``"general"`` if its lower bound is above 0, else ``"undetermined"``."""
    if max(values.dot_drop.mean(), values.general_drop.mean()) > delta:
        return "not converged"
    dot, general = values.dot, values.general
    if equivalent(dot, general, delta):
        return "tie"
    if paired_upper(dot, general) < 0:
        return "dot"
    return "general" if paired_lower(dot, general) > 0 else "undetermined"


def decisive_margin(values: Paired, delta: float) -> float:
    """How far (nats) the deciding bound of :func:`outcome` lies inside its threshold: the
    TOST bounds from ±delta (tie), the paired bound from 0 (dot, general), the guard's drop
    from delta (not converged); negative for undetermined: the least by which a label was
    missed."""
    label = outcome(values, delta)
    low, high = paired_lower(values.dot, values.general), paired_upper(values.dot, values.general)
    drop = max(values.dot_drop.mean(), values.general_drop.mean())
    return {
        "not converged": drop - delta,
        "tie": delta - max(-low, high),
        "dot": -high,
        "general": low,
    }.get(label, -min(max(-low, high) - delta, high, -low))


def verdict(outcomes: dict[str, str]) -> tuple[str, str]:
    """*Supported* iff dot wins a task and ties or wins every other; *refuted* iff general
    wins a task and ties or wins every other; else *inconclusive*: every task a tie (no
    difference either way: "dot ≥ general" is read as Luong's advantage for dot reproduced),
    dot and general each winning a task (task-specific), or a task undetermined or not
    converged."""
    found = set(outcomes.values())
    if "not converged" in found:
        return "inconclusive", "a task has not converged (the guard)"
    if "undetermined" in found:
        return "inconclusive", "a task is undetermined"
    if found == {"tie"}:
        return "inconclusive", "no difference on any task (a tie on every task is inconclusive)"
    if {"dot", "general"} <= found:
        return "inconclusive", "task-specific: each score wins a task"
    return ("supported", "dot wins") if "dot" in found else ("refuted", "general wins")


def bootstrap(values: dict[str, Paired], draws: int = DRAWS) -> float:
    """The share of ``draws`` seed resamplings (with replacement, the same seed ids for every
    task and both points; ``np.random.default_rng(0)``) whose :func:`verdict` is the record's."""
    found = verdict({t: outcome(v, margin(t)) for t, v in values.items()})[0]
    seeds = next(iter(values.values())).seeds
    if any(v.seeds != seeds for v in values.values()):
        raise Differs("results.csv: the tasks hold other seeds")
    rng, agree = np.random.default_rng(0), 0
    for _ in range(draws):
        index = rng.integers(0, len(seeds), len(seeds))
        outcomes = {t: outcome(v.take(index), margin(t)) for t, v in values.items()}
        agree += verdict(outcomes)[0] == found
    return agree / draws


def experiment(task: str, smoke: bool) -> Experiment:
    """The sweep of one task: both scores, each over its own grid (judged by :func:`verdict`)."""
    return Experiment(
        name=f"luong_scores/{task}",
        claim_id="S3",
        claim=" ".join(__doc__.split("\n\n")[0].split()),
        base=base_config(task, smoke),
        points=(DOT, GENERAL),
        metric="loss",
        verdict=lambda summary: ("inconclusive", "judged across tasks"),
        learning_rates=(1e-2,) if smoke else RATES,
        higher_is_better=False,
        pilot_seeds=PILOT_SEEDS,
    )


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """One sweep per task (dot vs general, ``SEEDS`` seeds × each point's grid), each row given
    its run's validation loss at step ¾·steps (``valid_loss_at_3q``, for the guard), then the
    rule of :func:`outcome` and :func:`verdict` on the test loss."""
    seeds = seeds or (1 if smoke else SEEDS)
    if shared := sorted(set(range(seeds)) & set(PILOT_SEEDS)):
        raise ValueError(f"seeds: the record would use the pilot seeds {shared}")
    rows = []
    for name in TASKS:
        exp = experiment(name, smoke)
        sweep(exp, out / name, num_seeds=seeds, overwrite=overwrite, workers=1)
        at_3q = valid_loss_at(out / name, exp.base.train.steps * 3 // 4)
        rows += [{"task": name} | r | {"valid_loss_at_3q": at_3q[r["point"], r["seed"],
                                                                 r["learning_rate"]]}
                 for r in read_rows(out / name / "results.csv")]  # fmt: skip
    analysis, summaries = _report(rows, smoke)
    _plot(summaries, out / "summary.png")
    return analysis


def valid_loss_at(folder: Path, step: int) -> dict[tuple[str, int, float], float]:
    """``{(point label, seed, rate): validation loss at step}`` from every run folder of a
    sweep (``points/<i>_<label>/`` and its ``lr=<rate>/`` extensions)."""
    found = {}
    for i, name in enumerate(labels((DOT, GENERAL))):
        for path in sorted(folder.glob(f"points/{i:02d}_*/**/metrics.jsonl")):
            for m in storage.read_jsonl(path):
                if (m["split"], m["metric"], m["step"]) == ("valid", "loss", step):
                    found[name, m["seed"], m["learning_rate"]] = m["value"]
    return found


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows: tables, verdict and reason. A ``Differs``
    if the rows hold a pilot seed or do not pair by seed."""
    rows = tables["results.csv"]
    if pilot := sorted({r["seed"] for r in rows} & set(PILOT_SEEDS)):
        raise Differs(f"results.csv: measured on the pilot seeds {pilot}")
    return _report(rows)[0]


def verdicts_from_rows(tables: dict[str, list[dict]]) -> dict[str, tuple[str, str]]:
    """The verdict of :func:`report_from_rows` alone (the audit's rule: no tables, no
    bootstrap)."""
    rows, outcomes = tables["results.csv"], {}
    for name in TASKS:
        v = _task([r for r in rows if r["task"] == name], name, smoke=False)[2]
        outcomes[name] = outcome(v, margin(name))
    return {"S3": verdict(outcomes)}


def _task(rows: list[dict], name: str, smoke: bool) -> tuple[Summary, dict[str, float], Paired]:
    """One task's summary, each point's chosen rate (by label) and the paired values there."""
    summary, _ = summarize(experiment(name, smoke), rows)
    points = (DOT, GENERAL)
    rates = {n: summary[p].learning_rate for n, p in zip(labels(points), points, strict=True)}
    return summary, rates, paired(rows, rates)


def _report(rows: list[dict], smoke: bool = False) -> tuple[record.Analysis, dict[str, Summary]]:
    table, summaries, values, outcomes, margins = [], {}, {}, {}, {}
    names = labels((DOT, GENERAL))
    for name in TASKS:
        task_rows = [r for r in rows if r["task"] == name]
        summaries[name], rates, v = _task(task_rows, name, smoke)
        values[name], delta = v, margin(name)
        dot, general = (summaries[name][p] for p in (DOT, GENERAL))
        outcomes[name], margins[name] = outcome(v, delta), decisive_margin(v, delta)
        low, high = paired_lower(v.dot, v.general), paired_upper(v.dot, v.general)
        accuracy = {n: np.mean([r["test_accuracy"] for r in task_rows
                                if r["point"] == n and r["learning_rate"] == rate])
                    for n, rate in rates.items()}  # fmt: skip
        table.append([name,
                      f"{fmt(dot.mean, dot.half_width)}; {accuracy[names[0]]:.3f} "
                      f"(lr {dot.learning_rate:g})",
                      f"{fmt(general.mean, general.half_width)}; {accuracy[names[1]]:.3f} "
                      f"(lr {general.learning_rate:g})",
                      f"{v.dot.mean() - v.general.mean():+.3f} [{low:+.3f}, {high:+.3f}]",
                      f"±{delta:.3f}",
                      f"{v.dot_drop.mean():+.3f} / {v.general_drop.mean():+.3f}",
                      outcomes[name], f"{margins[name]:+.3f}"])  # fmt: skip
    result, why = verdict(outcomes)
    agreement = bootstrap(values)
    seeds = next(iter(values.values())).seeds
    reason = (
        f"{why}. "
        + "; ".join(f"{t}: {o}" for t, o in outcomes.items())
        + f" (test loss in nats, dot − general paired by seed over seeds {seeds[0]}-{seeds[-1]},"
        " one-sided 95% bounds; tie = within ±2% of the chance loss by two one-sided tests;"
        " a tie on every task would be inconclusive, not support; seed-bootstrap agreement "
        f"{agreement:.0%}{' (fragile)' if agreement < FRAGILE_BELOW else ''})."
    )
    body = markdown_table(["task", "dot: test loss; accuracy", "general: test loss; accuracy",
                           "dot − general [90% paired]", "margin δ",
                           "valid drop, last ¼ (dot / general)", "outcome",
                           "decisive margin (nats)"], table)  # fmt: skip
    body += (
        "\n\n**Reference levels.** Chance loss (uniform over the target classes): "
        + ", ".join(f"{t} {chance_loss(t):.3f}" for t in TASKS)
        + f" nats; mqar's bag-of-values level (a uniform guess among the {NUM_PAIRS} values in "
        f"the context, no content alignment) ln {NUM_PAIRS} = {math.log(NUM_PAIRS):.3f} nats."
    )
    smallest = min(margins, key=margins.get)
    body += (
        f"\n\n**Bootstrap and margins.** {DRAWS} resamplings of the seeds (with replacement, "
        f"paired within each seed, `np.random.default_rng(0)`): {agreement:.1%} give the "
        f"record's verdict ({'fragile' if agreement < FRAGILE_BELOW else 'not fragile'}; "
        f"fragile below {FRAGILE_BELOW:.0%}). Decisive margin of each task (the deciding bound's "
        "distance inside its threshold: TOST bounds from ±δ for a tie, the paired bound from 0 "
        "for a win, the guard's drop beyond δ; negative: the least by which a label was "
        "missed): " + "; ".join(f"{t} {m:+.3f} nats ({_in_se(values[t], m)})"
                                for t, m in margins.items())
        + f". Smallest: {smallest}."
    )  # fmt: skip
    body += "\n\n**Checks (hold by construction, not counted).** " + checks_text(run_checks(CHECKS))
    body += (
        f"\n\n**Seeds.** Record seeds {list(seeds)}, paired by seed id across the two scores; "
        f"pilot seeds {list(PILOT_SEEDS)} are not among them."
    )
    for name, summary in summaries.items():
        body += f"\n\n**{name}.** " + sweep_tables(experiment(name, smoke), summary)
    analysis = record.analysis("luong_scores", "S3", rows, body, (result, reason), ["summary.png"])
    return analysis, summaries


def _in_se(values: Paired, nats: float) -> str:
    """``nats`` in standard errors of the paired mean difference."""
    d = values.dot - values.general
    se = float(d.std(ddof=1)) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return f"{nats / se:+.1f} SE" if se > 0 else "– SE"


def _plot(summaries: dict[str, Summary], path: Path) -> None:
    fig, axes = new_figure(1, len(summaries), figsize=(4.5 * len(summaries), 3.4))
    for ax, (name, summary) in zip(axes, summaries.items(), strict=True):
        dot, general = (summary[p] for p in (DOT, GENERAL))
        for a, b in zip(dot.values, general.values, strict=True):
            ax.plot([0, 1], [a, b], "k.-", ms=3, lw=0.6, alpha=0.6)
        ax.set_xticks([0, 1], ["dot", "general (W₀ = I)"])
        ax.set_xlim(-0.3, 1.3)
        ax.set_ylabel("test loss (nats)")
        ax.set_title(f"{name}: one line per seed")
        ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path, "Luong's global attention over LSTM states: dot vs general, by seed")
