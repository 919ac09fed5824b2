"""CLAIMS S7: a sinusoidal positional encoding that is too small leaves attention near uniform
(positions are invisible next to the token embeddings), one that is too large collapses it onto
one position (the logits grow as the amplitude squared and the softmax saturates); a middle band
of amplitudes works. Also measured, not judged: accuracy past the trained length for
sinusoidal, learned and rotary (RoPE) positions."""

import dataclasses
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
    Summary,
    grid,
    label,
    load_file,
    load_run,
    record,
    sweep,
)
from attnjax.experiment.config import with_overrides
from attnjax.experiment.report import fmt, markdown_table, mean_ci95, new_figure, save_figure
from attnjax.experiment.sweep import point_key, summarize, sweep_tables

_CONFIG = Path(__file__).parents[1] / "configs" / "positional_amplitude.py"
AMPLITUDES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)
NONE, LEARNED, ROPE = ({"model.positional": p} for p in ("none", "learned", "rope"))
SINUSOIDAL = {"model.pos_amplitude": 1.0}  # the sinusoidal point of the length comparison
SEEDS, LENGTH_FACTORS = 5, (1, 2, 4)
WORKS, FAILS = 0.5, 0.1  # share of the gap from "no positions" to the optimal accuracy
UNIFORM, COLLAPSED = 0.8, 0.9  # least entropy / log(t + 1); least max weight
STATS = ("entropy / log(t+1)", "max weight", "weight on t−1")


def attention_stats(weights: Float[Array, "B N T T"]) -> dict[str, float]:
    """Causal maps, rows ``t ≥ 1``: mean of ``entropy / log(t + 1)`` (1: uniform over the
    visible keys, 0: one-hot), of the largest weight, and of the weight on key ``t − 1``."""
    rows = weights[..., 1:, :]
    visible = jnp.arange(2, weights.shape[-1] + 1)
    values = (
        (analysis.entropy(rows) / jnp.log(visible)[None, None]).mean(),
        rows.max(-1).mean(),
        jnp.diagonal(weights, -1, -2, -1).mean(),
    )
    return dict(zip(STATS, map(float, values), strict=True))


def length_accuracy(
    models: list[nnx.Module], batches: list[dict], trained: int
) -> list[float] | str:
    """Each model's accuracy on its Markov batch (one per seed) at positions ``≥ trained``
    (all positions if the batches are no longer); the error text if a model rejects the
    length."""
    accuracies = []
    for model, batch in zip(models, batches, strict=True):
        length = batch["inputs"].shape[1]
        if length > trained:
            later = (jnp.arange(length) >= trained)[None]
            batch = batch | {"loss_mask": batch["loss_mask"] & later}
        try:
            accuracies.append(float(tasks.get("markov").metrics(model(batch), batch)["accuracy"]))
        except ValueError as error:
            return f"{type(error).__name__}: {error}"
    return accuracies


def _mean(stats: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}


def verdict(
    summary: Summary, optimum: float, attention: dict[str, dict] | None = None
) -> tuple[str, str]:
    """The rule of :func:`analyze`. Without ``attention`` (trained stats by :func:`point_key`),
    its accuracy part only: supported iff an interior amplitude works and both extremes fail."""
    amps = sorted(p["model.pos_amplitude"] for p, _ in summary if "model.pos_amplitude" in p)
    base = summary[NONE].mean
    gap = optimum - base
    acc = {a: summary[{"model.pos_amplitude": a}].mean for a in amps}
    works = {a: m >= base + WORKS * gap for a, m in acc.items()}
    small, large = amps[0], amps[-1]
    checks = {
        "a middle amplitude works": any(works[a] for a in amps[1:-1]),
        "smallest fails": acc[small] <= base + FAILS * gap,
        "largest fails": acc[large] <= base + FAILS * gap,
    }
    if attention is not None:
        at = {a: attention[point_key({"model.pos_amplitude": a})] for a in (small, large)}
        checks["smallest near uniform"] = at[small]["entropy / log(t+1)"] >= UNIFORM
        checks["largest collapsed"] = at[large]["max weight"] >= COLLAPSED
    reason = (
        "test accuracy by amplitude: "
        + ", ".join(f"{a:g} {m:.3f}" for a, m in acc.items())
        + f"; no positions {base:.3f}, optimum {optimum:.3f} (works ≥ "
        f"{base + WORKS * gap:.3f}, fails ≤ {base + FAILS * gap:.3f}). Checks: "
        + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in checks.items())
        + ("." if attention is not None else " (accuracy part only).")
    )
    if all(checks.values()):
        return "supported", reason
    if (works[small] and works[large]) or not any(works.values()):
        return "refuted", reason
    return "inconclusive", reason


def _experiment(smoke: bool) -> Experiment:
    """The training sweep :func:`analyze` runs: amplitudes, no positions, learned, RoPE."""
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    optimum = base.task.spec.baselines["optimal_accuracy"]
    return Experiment(
        name="positional_amplitude",
        claim_id="S7",
        claim=" ".join(__doc__.split()),
        base=base,
        points=(SINUSOIDAL, NONE, LEARNED)
        if smoke
        else (*grid(**{"model.pos_amplitude": AMPLITUDES}), NONE, LEARNED, ROPE),
        metric="accuracy",
        verdict=lambda summary: verdict(summary, optimum),
    )


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train every point for ``SEEDS`` seeds (vectorized; ``--seeds`` sets another
    count), then measure attention at initialization and after training, and accuracy past the
    trained length ``T``.

    Verdict rule (declared before measuring). Yardsticks: the measured accuracy without
    positions a₀ (``positional=none``) and the chain's optimal accuracy a*. An amplitude
    *works* if its mean test accuracy is ≥ a₀ + 0.5 (a* − a₀) and *fails* if ≤ a₀ + 0.1
    (a* − a₀). *Supported* iff an amplitude strictly inside the grid works, the smallest fails
    with trained attention near uniform (mean entropy / log(t + 1) ≥ ``UNIFORM``) and the
    largest fails with trained attention collapsed (mean max weight ≥ ``COLLAPSED``).
    *Refuted* iff both extremes work (no band) or no amplitude works; else *inconclusive*.
    Length generalization is reported, not judged: sinusoidal (amplitude 1), learned (a table
    of ``max_len = 2T`` rows: rows T … 2T−1 are never trained, longer inputs raise
    ``ValueError``) and RoPE, accuracy on positions ≥ T of sequences 2T and 4T long.
    """
    experiment = _experiment(smoke)
    default, batch_size, factors = (1, 16, (1, 4)) if smoke else (SEEDS, 256, LENGTH_FACTORS)
    seeds = seeds or default
    outcome = sweep(experiment, out, num_seeds=seeds, overwrite=overwrite)
    summary, base = outcome.summary, experiment.base
    seed_range = range(base.train.seed, base.train.seed + seeds)
    t = base.task.seq_len
    task = tasks.get("markov")
    longest = dataclasses.replace(base.task, seq_len=max(factors) * t)

    def draws(stream: int, task_config) -> list[dict]:  # one batch per seed
        return [task.generate(jax.random.fold_in(jax.random.key(stream), s), batch_size,
                              task_config) for s in seed_range]  # fmt: skip

    batches, longest = draws(8, base.task), draws(9, longest)  # stationary: prefixes
    prefixes = {f: [jax.tree.map(lambda x, f=f: x[:, : f * t], b) for b in longest]
                for f in factors}  # fmt: skip
    trained, init, lengths = {}, {}, {}
    for point, folder in zip(experiment.points, outcome.folders, strict=True):
        config = with_overrides(base, point)
        models = [load_run(folder, r)[1] for r in range(seeds)]
        inits = [nn.build(config.model, nnx.Rngs(s)) for s in seed_range]
        name = point_key(point)
        trained[name], init[name] = (
            _mean(
                [attention_stats(attention_maps(m, b)[0]) for m, b in zip(ms, batches, strict=True)]
            )
            for ms in (models, inits)
        )
        if point in (SINUSOIDAL, LEARNED, ROPE):
            lengths[name] = {f: length_accuracy(models, b, t) for f, b in prefixes.items()}
    optimum = base.task.spec.baselines["optimal_accuracy"]
    _plot(summary, (init, trained), lengths, t, optimum,
          out / "positional_amplitude.png")  # fmt: skip
    rows = [
        {"point": label(p), "seed": seed_range[r], "test_accuracy": v}
        | {f"trained {k}": trained[point_key(p)][k] for k in STATS}
        | {f"init {k}": init[point_key(p)][k] for k in STATS}
        for p, s in summary for r, v in enumerate(s.values)
    ] + [
        {"point": f"{label(dict(name))} length={f * t}", "seed": seed_range[r], "test_accuracy": v}
        for name, accs in lengths.items() for f, a in accs.items() if isinstance(a, list)
        for r, v in enumerate(a)
    ]  # fmt: skip
    tables = {"results.csv": record.read_rows(out / "results.csv"), "analysis.csv": rows}
    return report_from_rows(tables, smoke)


def _lengths(rows: list[dict], experiment: Experiment, factors) -> dict:
    """Accuracy past the trained length by encoding and length factor, from the analysis rows:
    the seeds' accuracies, or, for a length without rows, the error text of the encoding's
    model (built untrained) on a batch of that length."""
    base, t = experiment.base, experiment.base.task.seq_len
    lengths = {}
    for point in (SINUSOIDAL, LEARNED, ROPE):
        if point not in experiment.points:
            continue
        lengths[point_key(point)] = accs = {}
        for f in factors:
            name = f"{label(point)} length={f * t}"
            accs[f] = [r["test_accuracy"] for r in rows if r["point"] == name]
            if not accs[f]:
                config = with_overrides(base, point)
                task = dataclasses.replace(base.task, seq_len=f * t)
                batch = tasks.get("markov").generate(jax.random.key(0), 1, task)
                accs[f] = length_accuracy([nn.build(config.model, nnx.Rngs(0))], [batch], t)
                if isinstance(accs[f], list):
                    raise ValueError(f"analysis.csv: no rows for {name}, which the model takes")
    return lengths


def verdicts_from_rows(tables: dict[str, list[dict]]) -> dict[str, tuple[str, str]]:
    """The verdict of :func:`report_from_rows` alone (the audit's rule: no length table, whose
    missing lengths build models)."""
    experiment = _experiment(False)
    summary, trained, _ = _stats(experiment, tables)
    optimum = experiment.base.task.spec.baselines["optimal_accuracy"]
    return {"S7": verdict(summary, optimum, trained)}


def _stats(experiment: Experiment, tables: dict[str, list[dict]]) -> tuple[Summary, dict, dict]:
    """The sweep's summary and each point's trained and initial attention stats (by
    :func:`point_key`; seed means, on every row of the point)."""
    summary, _ = summarize(experiment, tables["results.csv"])
    first = {r["point"]: r for r in reversed(tables["analysis.csv"])}
    trained, init = (
        {point_key(p): {k: first[label(p)][f"{when} {k}"] for k in STATS} for p, _ in summary}
        for when in ("trained", "init")
    )
    return summary, trained, init


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from the sweep's ``results.csv`` and its own
    ``analysis.csv``: tables, verdict and reason."""
    experiment = _experiment(smoke)
    factors = (1, 4) if smoke else LENGTH_FACTORS
    summary, trained, init = _stats(experiment, tables)
    rows, t = tables["analysis.csv"], experiment.base.task.seq_len
    lengths = _lengths(rows, experiment, factors)
    table_rows = [[label(p), fmt(s.mean, s.half_width),
                   *(f"{init[point_key(p)][k]:.3f}" for k in STATS),
                   *(f"{trained[point_key(p)][k]:.3f}" for k in STATS)]
                  for p, s in summary]  # fmt: skip
    header = ["point", "test accuracy", *(f"{k} (init)" for k in STATS), *STATS]
    length_rows = [[label(dict(name)), *(fmt(*mean_ci95(a)) if isinstance(a, list) else a
                            for a in accs.values())] for name, accs in lengths.items()]  # fmt: skip
    length_header = ["encoding", *(f"T = {f * t}, positions ≥ {t}" if f > 1 else f"T = {t}"
                                   for f in factors)]  # fmt: skip
    table = "\n".join([
        sweep_tables(experiment, summary),
        markdown_table(header, table_rows),
        markdown_table(length_header, length_rows),
    ])  # fmt: skip
    optimum = experiment.base.task.spec.baselines["optimal_accuracy"]
    return record.analysis(
        "positional_amplitude", "S7", rows, table, verdict(summary, optimum, trained),
        ["summary.png", "positional_amplitude.png"], csv_name="analysis.csv",
    )  # fmt: skip


def _plot(summary: Summary, attention: tuple[dict, dict], lengths: dict, t: int,
          optimum: float, path: Path) -> None:  # fmt: skip
    fig, axes = new_figure(1, 3, figsize=(15, 4))
    x = sorted(p["model.pos_amplitude"] for p, _ in summary if "model.pos_amplitude" in p)
    amps = [point_key({"model.pos_amplitude": a}) for a in x]
    stats = [summary[dict(n)] for n in amps]
    axes[0].errorbar(x, [s.mean for s in stats], yerr=[s.mean - s.lower for s in stats],
                     fmt="o-", capsize=3, label="sinusoidal, amplitude A")  # fmt: skip
    for point, style in ((NONE, ":"), (LEARNED, "--"), (ROPE, "-.")):
        if point in summary:
            axes[0].axhline(summary[point].mean, ls=style, color="gray", label=label(point))
    axes[0].axhline(optimum, color="k", lw=0.8, label="optimal accuracy")
    axes[0].set_ylabel("test next-token accuracy (mean ± 95% CI)")
    for key, color in zip(STATS, ("C0", "C3", "C2"), strict=True):
        for stats, when, style in zip(attention, ("at init", "trained"), ("--", "o-"), strict=True):
            axes[1].plot(x, [stats[n][key] for n in amps], style, color=color, ms=4,
                         label=f"{key}, {when}")  # fmt: skip
    axes[1].set_ylabel("attention statistic (mean over rows t ≥ 1)")
    for ax in axes[:2]:
        ax.set_xscale("log")
        ax.set_xlabel("sinusoidal amplitude A")
    for name, accs in lengths.items():
        points = [(f * t, np.mean(a)) for f, a in accs.items() if isinstance(a, list)]
        name = "sinusoidal, A = 1" if dict(name) == SINUSOIDAL else label(dict(name))
        axes[2].plot(*zip(*points, strict=True), "o-", label=name)
    axes[2].axhline(summary[NONE].mean, ls=":", color="gray", label="positional=none")
    axes[2].axhline(optimum, color="k", lw=0.8, label="optimal accuracy")
    axes[2].set_xlabel(f"evaluated length (trained: {t}; longer: scored on positions ≥ {t})")
    axes[2].set_ylabel("next-token accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(
        fig, path, "positional encodings on an order-2 Markov language (1 causal layer, 1 head)"
    )
