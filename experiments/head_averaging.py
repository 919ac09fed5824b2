"""CLAIMS M4: sharp (low-entropy) heads can average into a multimodal distribution: in a trained
multi-head model whose heads attend sharply, the head-averaged map (the one usually plotted)
spreads over several keys, so it is not a picture of any head. Measured on the head-pruning
model (order-2 Markov language, 2 causal layers of 8 heads), 5 seeds."""

from pathlib import Path

import numpy as np

from attnjax import analysis
from attnjax.analysis import pruning
from attnjax.experiment import load_file, load_run, record, train_and_evaluate
from attnjax.experiment.report import fmt, markdown_table, mean_ci95, new_figure, save_figure
from attnjax.experiment.trainer import get_trainer

_CONFIG = Path(__file__).parents[1] / "configs" / "head_pruning.py"
SEEDS = 5
SHARP, MODE = 0.5, 0.2  # a sharp head's top weight; a mode's share of the averaged map
MIN_KEYS = 4  # rows with fewer visible keys (causal) are left out
SHARP_ROWS, MULTIMODAL, UNIMODAL = 0.1, 0.25, 0.05


def row_stats(weights: np.ndarray) -> dict[str, np.ndarray]:
    """For one layer's weights ``[B, N, T, S]`` (causal: row t sees t + 1 keys), per row
    ``[B, T]``: the number of sharp heads (top weight ≥ ``SHARP``), whether their average has
    two or more keys of weight ≥ ``MODE`` (multimodal), the entropy of that average and the
    sharp heads' mean entropy (nats)."""
    sharp = weights.max(-1) >= SHARP  # [B, N, T]
    count = sharp.sum(1)
    average = (weights * sharp[..., None]).sum(1) / np.maximum(count, 1)[..., None]
    heads_entropy = np.asarray(analysis.entropy(weights))
    return {
        "sharp_heads": count,
        "multimodal": (average >= MODE).sum(-1) >= 2,
        "average_entropy": np.asarray(analysis.entropy(average)),
        "heads_entropy": (heads_entropy * sharp).sum(1) / np.maximum(count, 1),
    }


def seed_stats(maps: list[np.ndarray]) -> dict[str, float]:
    """Over every layer's rows with ≥ ``MIN_KEYS`` keys: the share of rows with two or more
    sharp heads, and among those rows the share whose sharp-head average is multimodal and the
    mean entropy gap H(average) − mean H(sharp heads)."""
    stats = [row_stats(np.asarray(w)) for w in maps]
    visible = np.arange(maps[0].shape[2]) + 1 >= MIN_KEYS
    rows = np.concatenate([(s["sharp_heads"] >= 2)[:, visible].ravel() for s in stats])
    pick = [(s["sharp_heads"] >= 2) & visible for s in stats]

    def among(name):
        return np.concatenate([s[name][p] for s, p in zip(stats, pick, strict=True)])

    gap = among("average_entropy") - among("heads_entropy")
    return {
        "sharp_rows": float(rows.mean()),
        "multimodal": float(among("multimodal").mean()) if rows.any() else 0.0,
        "entropy_gap": float(gap.mean()) if rows.any() else 0.0,
        "heads_entropy": float(among("heads_entropy").mean()) if rows.any() else 0.0,
    }


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train the head-pruning config for ``SEEDS`` seeds; on each seed's test batch, take every
    layer's attention maps and, per query row, the heads whose top weight is ≥ 0.5.

    Verdict rule (declared before measuring), on rows with two or more sharp heads: *supported*
    iff such rows are ≥ 10% of all rows (seed mean) and the share of them whose sharp-head
    average puts ≥ 0.2 on two or more keys has a 95% interval (over seeds) whose lower end is
    ≥ 0.25; *refuted* iff such rows are ≥ 10% and that share's upper end is < 0.05 (sharp heads
    agree, so their average stays sharp); else *inconclusive*.
    """
    config = load_file(_CONFIG).get_config("smoke" if smoke else None)
    seeds = seeds or (1 if smoke else SEEDS)
    train_and_evaluate(config, out / "train", num_seeds=seeds, overwrite=overwrite)
    trainer = get_trainer(config)
    rows, example = [], None
    for r, seed in enumerate(range(config.train.seed, config.train.seed + seeds)):
        model = load_run(out / "train", r)[1]
        maps = pruning.attention_maps(model, trainer.eval_batch(seed, "test"))
        stats = seed_stats(maps)
        rows.append({"point": "trained", "seed": seed, **stats})
        example = np.asarray(maps[-1]) if example is None else example
    _plot(example, out / "summary.png")
    return report_from_rows({"results.csv": rows})


def report_from_rows(tables: dict[str, list[dict]]) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per seed): table, verdict and reason."""
    rows = tables["results.csv"]
    names = [k for k in rows[0] if k not in ("point", "seed")]
    summary = {n: mean_ci95([r[n] for r in rows]) for n in names}
    table = markdown_table(["measure", f"mean ± 95% interval over {len(rows)} seeds"],
                           [[n, fmt(*summary[n])] for n in names])  # fmt: skip
    share, (multi, half) = summary["sharp_rows"][0], summary["multimodal"]
    half = 0.0 if np.isnan(half) else half
    reason = (
        f"{share:.0%} of rows have ≥ 2 sharp heads (top weight ≥ {SHARP}); of those, "
        f"{multi:.1%} ± {half:.1%} average into a map with ≥ 2 keys at ≥ {MODE}; the average's "
        f"entropy exceeds the sharp heads' mean ({summary['heads_entropy'][0]:.2f} nats) by "
        f"{summary['entropy_gap'][0]:.2f} nats."
    )
    if share >= SHARP_ROWS and multi - half >= MULTIMODAL:
        verdict = "supported"
    elif share >= SHARP_ROWS and multi + half < UNIMODAL:
        verdict = "refuted"
    else:
        verdict = "inconclusive"
    return record.analysis("head_averaging", "M4", rows, table, (verdict, reason), ["summary.png"])


def _plot(weights: np.ndarray, path: Path) -> None:
    """One query row of the last layer ``weights [B, N, T, S]``: the first row (from the end of
    the first example on) with two or more sharp heads, its sharp heads and their average."""
    sharp = weights.max(-1) >= SHARP  # [B, N, T]
    rows = np.argwhere(sharp.sum(1) >= 2)
    b, t = rows[np.lexsort((-rows[:, 1], rows[:, 0]))][0] if len(rows) else (0, -1)
    fig, ax = new_figure(figsize=(8, 3.6))
    keys = np.arange(weights.shape[-1])
    for n in np.flatnonzero(sharp[b, :, t]):
        ax.plot(keys, weights[b, n, t], "o-", ms=3, alpha=0.7, label=f"head {n} (sharp)")
    if sharp[b, :, t].any():
        ax.bar(keys, weights[b, sharp[b, :, t], t].mean(0), color="k", alpha=0.25,
               label="their average")  # fmt: skip
    ax.set_xlabel("key position")
    ax.set_ylabel("attention weight")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path, f"sharp heads and their average (last layer, example {b}, row {t})")
