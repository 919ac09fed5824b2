"""CLAIMS S9: low attention entropy accompanies instability (entropy collapse, Zhai et al.,
2023): in runs that become unstable, attention entropy falls below anything stable runs reach
*before* the loss blows up. Measured on the QK-norm experiment's model without QK-LayerNorm
(order-2 Markov language) across learning rates from stable to unstable, evaluated every 20
steps."""

from pathlib import Path

import numpy as np

from attnjax.experiment import (
    ExperimentConfig,
    load_file,
    record,
    train_and_evaluate,
    with_overrides,
)
from attnjax.experiment.report import markdown_table, new_figure, save_figure
from attnjax.experiment.storage import read_jsonl

_CONFIG = Path(__file__).parents[1] / "configs" / "qk_norm.py"
LEARNING_RATES = (1e-2, 3e-2, 1e-1, 3e-1, 1.0)  # qk_norm's record: stable up to 3e-2
SEEDS, EVAL_EVERY = 5, 20
SPIKE = 0.3  # nats above the run's lowest training loss so far
MIN_SPIKES, PRECEDES, UNRELATED = 5, 0.8, 0.2


def trajectories(metrics: list[dict]) -> dict[tuple[int, float], dict[str, np.ndarray]]:
    """Per run (seed, learning rate): ``step``, training ``loss`` (mean over each chunk) and
    validation ``entropy`` (attention entropy, mean over layers, heads and rows), each ``[E]``."""
    runs: dict[tuple[int, float], dict[str, dict[int, float]]] = {}
    for m in metrics:
        name = {("train", "loss"): "loss", ("valid", "attention_entropy"): "entropy"}.get(
            (m["split"], m["metric"])
        )
        if name:
            run = runs.setdefault((m["seed"], m["learning_rate"]), {"loss": {}, "entropy": {}})
            run[name][m["step"]] = m["value"]
    out = {}
    for key, run in runs.items():
        steps = sorted(run["loss"])
        out[key] = {"step": np.array(steps), "loss": np.array([run["loss"][s] for s in steps]),
                    "entropy": np.array([run["entropy"][s] for s in steps])}  # fmt: skip
    return out


def spike_step(loss: np.ndarray, steps: np.ndarray) -> int | None:
    """The first step whose loss is NaN or ``SPIKE`` nats above the lowest loss before it."""
    lowest = np.minimum.accumulate(np.nan_to_num(loss, nan=np.inf))
    for i in range(1, len(loss)):
        if np.isnan(loss[i]) or loss[i] > lowest[i - 1] + SPIKE:
            return int(steps[i])
    return None


def first_below(values: np.ndarray, steps: np.ndarray, floor: float) -> int | None:
    below = np.flatnonzero(values < floor)
    return int(steps[below[0]]) if below.size else None


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train every learning rate × seed; a run *spikes* at the first evaluation whose training
    loss is NaN or ``SPIKE`` = 0.3 nats above its lowest loss so far; runs that never spike and
    end below the bigram loss (they learned the order-2 context) are *stable* (runs that never
    spike nor learn are neither), and the *floor* is the lowest attention entropy any stable run
    reaches at any evaluation; a spiking run *collapses* at the first evaluation whose entropy
    is below the floor.

    Verdict rule (declared before measuring): with at least ``MIN_SPIKES`` spiking runs and
    one stable run, *supported* iff ≥ 80% of spiking runs collapse strictly before they spike;
    *refuted* iff ≤ 20% collapse at or before the spike (low entropy neither precedes nor
    accompanies the instability); else *inconclusive*.
    """
    config = _config(smoke)
    bigram = config.task.spec.baselines["bigram_loss"]
    lrs, default = ((1e-2, 3.0), 1) if smoke else (LEARNING_RATES, SEEDS)
    seeds = seeds or default
    train_and_evaluate(
        config, out / "train", num_seeds=seeds, learning_rates=lrs, overwrite=overwrite
    )
    runs = trajectories(read_jsonl(out / "train" / "metrics.jsonl"))
    spikes = {k: spike_step(r["loss"], r["step"]) for k, r in runs.items()}
    rows = [
        {"point": f"lr={lr:g}", "seed": seed, "learning_rate": lr, "spike_step": spikes[seed, lr],
         "collapse_step": None, "final_loss": float(run["loss"][-1]),
         "min_entropy": float(run["entropy"].min())}
        for (seed, lr), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]  # fmt: skip
    lowest = floor(rows, bigram)
    for r in rows:
        run = runs[r["seed"], r["learning_rate"]]
        r["collapse_step"] = first_below(run["entropy"], run["step"], lowest)
    _plot(runs, spikes, lowest, lrs, out / "summary.png")
    return report_from_rows({"results.csv": rows}, smoke)


def _config(smoke: bool) -> ExperimentConfig:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    every = base.train.eval_every if smoke else EVAL_EVERY
    return with_overrides(base, {"train.eval_every": every, "model.qk_norm": False})


def stable_entropies(rows: list[dict], bigram: float) -> list[float]:
    """The least attention entropy of each stable run: it never spikes and ends below the
    bigram loss."""
    return [r["min_entropy"] for r in rows
            if r["spike_step"] is None and r["final_loss"] < bigram]  # fmt: skip


def floor(rows: list[dict], bigram: float) -> float:
    """The lowest attention entropy any stable run reaches (NaN without a stable run)."""
    return float(min(stable_entropies(rows, bigram), default=float("nan")))


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per run): table, verdict and reason."""
    rows, config = tables["results.csv"], _config(smoke)
    bigram = config.task.spec.baselines["bigram_loss"]
    stable = stable_entropies(rows, bigram)
    spiking = [r for r in rows if r["spike_step"] is not None]
    steps = [(r["collapse_step"], r["spike_step"]) for r in spiking]
    before = sum(c is not None and c < s for c, s in steps)
    at_or_before = sum(c is not None and c <= s for c, s in steps)
    n = len(spiking)
    reason = (
        f"{n} of {len(rows)} runs spike, {len(stable)} are stable; stable runs' entropy floor "
        f"{floor(rows, bigram):.3f} nats; of the spiking runs, {before} collapse below it "
        f"strictly before the spike and {at_or_before} at or before it (evaluations every "
        f"{config.train.eval_every} steps)."
    )
    if n < (1 if smoke else MIN_SPIKES) or not stable:
        verdict = "inconclusive"
    elif before >= PRECEDES * n:
        verdict = "supported"
    else:
        verdict = "refuted" if at_or_before <= UNRELATED * n else "inconclusive"
    lrs = dict.fromkeys(r["learning_rate"] for r in rows)
    table = markdown_table(
        ["learning rate", "runs that spike", "spike step", "collapse step", "min entropy"],
        [[f"{lr:g}", sum(r["spike_step"] is not None for r in group),
          ", ".join(str(r["spike_step"]) for r in group),
          ", ".join(str(r["collapse_step"]) for r in group),
          ", ".join(f"{r['min_entropy']:.2f}" for r in group)]
         for lr in lrs for group in [[r for r in rows if r["learning_rate"] == lr]]],
    )  # fmt: skip
    return record.analysis(
        "entropy_collapse", "S9", rows, table, (verdict, reason), ["summary.png"]
    )


def _plot(runs, spikes, floor: float, lrs, path: Path) -> None:
    """Training loss and attention entropy against step for the first seed at every rate."""
    seed = min(s for s, _ in runs)
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 3.8))
    for lr in lrs:
        r = runs[seed, lr]
        line = ax1.plot(r["step"], r["loss"], label=f"lr {lr:g}")[0]
        ax2.plot(r["step"], r["entropy"], color=line.get_color(), label=f"lr {lr:g}")
        if spikes[seed, lr] is not None:
            for ax in (ax1, ax2):
                ax.axvline(spikes[seed, lr], color=line.get_color(), ls=":", lw=1)
    ax2.axhline(floor, color="k", ls="--", lw=1, label="stable runs' floor")
    ax1.set_ylabel("training loss (nats)")
    ax2.set_ylabel("attention entropy (nats)")
    for ax in (ax1, ax2):
        ax.set_xlabel("step (dotted: loss spike)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, f"entropy collapse, seed {seed}, no QK-LayerNorm")
