"""CLAIMS S6: without QK-LayerNorm the max attention logit grows with the learning rate until
training diverges; per-head QK-LayerNorm caps it and lowers the LR sensitivity, the mean over
an LR grid of min(loss(η), loss₀) − min_η loss(η) (Wortsman et al., 2023; Dehghani et al.,
2023). Forcing the max logit to ≈ κ degrades the loss near κ = 1e3 and makes it worse than a
bigram model near κ = 1e4."""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnjax import nn
from attnjax.experiment import (
    ExperimentConfig,
    Runs,
    Trainer,
    load_file,
    record,
    train_and_evaluate,
    with_overrides,
)
from attnjax.experiment.report import markdown_table, new_figure, save_figure
from attnjax.experiment.trainer import get_trainer

_CONFIG = Path(__file__).parents[1] / "configs" / "qk_norm.py"
LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)  # Wortsman's grid, ×10 up
KAPPAS = (1.0, 10.0, 1e2, 1e3, 1e4)
SEEDS, CAP, DEGRADED = 5, 0.1, 0.05
METRICS = ("loss", "attention_max_logit")


class FixedScale(nnx.Variable):
    """A score scale held fixed: not an ``nnx.Param``, so the optimizer leaves it alone."""


class ForcedLogits(Trainer):
    """A trainer whose logits are ``g(q)·g(k)/√H`` with ``g(z) = √κ·z/√E[z²]`` (E over the head
    dimension H), i.e. ``κ√H·cos(q, k)``: the config's cosine score with its scale fixed at
    ``κ√H``. Run ``r`` of :meth:`init` has ``κ = kappas[r]``."""

    def __init__(self, config: ExperimentConfig, kappas: np.ndarray):
        self.kappas = jnp.asarray(kappas, jnp.float32)
        super().__init__(config)

    def build_model(self, key: jax.Array) -> nnx.Module:
        model = super().build_model(key)
        for _, module in nnx.iter_modules(model):
            if isinstance(module, nn.MultiHeadAttention):
                scale = jnp.full((module.num_heads,), math.sqrt(module.head_dim))
                module.score.scale = FixedScale(scale)  # κ = 1 until init
        return model

    def init(self, runs: Runs):
        state, lrs = super().init(runs)

        def force(v):
            return v.replace(v[...] * self.kappas[:, None]) if isinstance(v, FixedScale) else v

        rest = jax.tree.map(force, state.rest, is_leaf=lambda v: isinstance(v, nnx.Variable))
        return state._replace(rest=rest), lrs


def lr_sensitivity(losses: np.ndarray, loss0: np.ndarray) -> np.ndarray:
    """Wortsman et al.'s LR sensitivity per seed for final ``losses [L, seeds]`` over an LR grid
    and the loss at initialization ``loss0 [seeds]``: mean over the grid of ``min(loss, loss₀)
    − min_η loss``; a diverged (NaN) loss counts as ``loss₀``."""
    capped = np.fmin(losses, loss0)
    return capped.mean(axis=0) - capped.min(axis=0)


def lr_sweep(
    config: ExperimentConfig, out: Path, lrs, seeds: int, overwrite: bool
) -> dict[str, np.ndarray]:
    """Final test ``loss`` and ``attention_max_logit`` and the validation loss ``valid_loss``
    ``[L, seeds]``, and ``loss0 [seeds]``."""
    rows = train_and_evaluate(config, out, num_seeds=seeds, learning_rates=lrs, overwrite=overwrite)
    result = {m: np.array([r[f"test_{m}"] for r in rows]).reshape(len(lrs), seeds) for m in METRICS}
    result["valid_loss"] = np.array([r["valid_loss"] for r in rows]).reshape(len(lrs), seeds)
    trainer = get_trainer(config)  # the same compiled programs; runs are lr-major
    runs = Runs.grid(range(config.train.seed, config.train.seed + seeds), lrs)
    initial, _ = trainer.init(runs)
    return result | {"loss0": trainer.evaluate(initial, runs, "test")["loss"][:seeds]}


def forced_logits(
    config: ExperimentConfig, out: Path, kappas, seeds: int, overwrite: bool
) -> dict[str, np.ndarray]:
    """Final test ``loss`` and ``attention_max_logit`` and the validation loss ``valid_loss``
    ``[K, seeds]`` at the config's learning rate with the logits forced by ``κ``
    (:class:`ForcedLogits`), all runs in one program, in the run folder ``out``."""
    config = with_overrides(config, {"model.score": "cosine"})
    rows = train_and_evaluate(
        config, out, num_seeds=seeds, learning_rates=[config.optim.learning_rate] * len(kappas),
        overwrite=overwrite, trainer=ForcedLogits(config, np.repeat(kappas, seeds)),
    )  # fmt: skip
    columns = {m: f"test_{m}" for m in METRICS} | {"valid_loss": "valid_loss"}
    return {
        m: np.array([r[c] for r in rows]).reshape(len(kappas), seeds) for m, c in columns.items()
    }


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """The LR sweep with and without QK-norm, and the forced-logit runs.

    Verdict rule (declared before running): with LR sensitivity computed per seed and the
    *peak max logit* = the largest over the grid of the seed-mean max logit (a NaN run counts
    as infinite), *supported* iff QK-norm's sensitivity is lower for every seed and its peak
    max logit is ≤ ``CAP`` × the unnormalized model's; *refuted* iff its sensitivity is higher
    for every seed or its peak is not below the unnormalized one's; else *inconclusive*. The
    forced-logit part is reported beside it, not in the verdict: "degrades near 1e3" iff
    loss(κ = 1e3) exceeds the best loss over κ by ≥ ``DEGRADED`` nats, "worse than bigram
    near 1e4" iff loss(κ = 1e4) > the exact bigram loss.
    """
    config = load_file(_CONFIG).get_config("smoke" if smoke else None)
    lrs = (1e-2, 3.0) if smoke else LEARNING_RATES
    kappas, default = ((1.0, 1e3, 1e4), 1) if smoke else (KAPPAS, SEEDS)
    seeds = seeds or default
    # One after another: run from threads, these programs' evaluations deadlocked XLA's CPU
    # runtime (2 cores, 2 or 3 threads, every program waiting with the CPU idle).
    sweeps = {qk: lr_sweep(with_overrides(config, {"model.qk_norm": qk}), out / f"qk_norm={qk}",
                           lrs, seeds, overwrite) for qk in (False, True)}  # fmt: skip
    forced = forced_logits(config, out / "forced_logits", kappas, seeds, overwrite)
    chosen = {qk: _best(sweep) for qk, sweep in sweeps.items()}
    rows = [
        {"point": f"qk_norm={qk}", "seed": config.train.seed + s, "learning_rate": lr,
         "chosen": i == chosen[qk], "kappa": None, "valid_loss": float(sweep["valid_loss"][i, s])}
        | {f"test_{m}": float(sweep[m][i, s]) for m in METRICS}
        | {"loss0": float(sweep["loss0"][s])}
        for qk, sweep in sweeps.items() for i, lr in enumerate(lrs) for s in range(seeds)
    ] + [
        {"point": f"forced kappa={k:g}", "seed": config.train.seed + s,
         "learning_rate": config.optim.learning_rate, "chosen": True, "kappa": k,
         "valid_loss": float(forced["valid_loss"][i, s])}
        | {f"test_{m}": float(forced[m][i, s]) for m in METRICS}
        for i, k in enumerate(kappas) for s in range(seeds)
    ]  # fmt: skip
    _plot(lrs, sweeps, kappas, forced, config.task.spec.baselines, out / "summary.png")
    return report_from_rows({"results.csv": rows}, smoke)


def from_rows(rows: list[dict]) -> tuple[list, dict, list, dict]:
    """``(lrs, sweeps, kappas, forced)`` as :func:`lr_sweep` and :func:`forced_logits` give
    them, from the analysis rows (learning-rate major, then seed; ``loss0`` in float32, as
    measured)."""

    def arrays(group: list[dict], steps: list, columns: dict[str, str]) -> dict[str, np.ndarray]:
        return {name: np.array([r[c] for r in group]).reshape(len(steps), -1)
                for name, c in columns.items()}  # fmt: skip

    columns = {m: f"test_{m}" for m in METRICS} | {"valid_loss": "valid_loss"}
    sweeps, lrs = {}, []
    for qk in (False, True):
        group = [r for r in rows if r["point"] == f"qk_norm={qk}"]
        lrs = list(dict.fromkeys(r["learning_rate"] for r in group))
        seeds = len(group) // len(lrs)
        loss0 = np.array([r["loss0"] for r in group[:seeds]], np.float32)
        sweeps[qk] = arrays(group, lrs, columns) | {"loss0": loss0}
    group = [r for r in rows if r["kappa"] is not None]
    kappas = list(dict.fromkeys(r["kappa"] for r in group))
    return lrs, sweeps, kappas, arrays(group, kappas, columns)


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per run): tables, verdict and reason."""
    config = load_file(_CONFIG).get_config("smoke" if smoke else None)
    rows, spec = tables["results.csv"], config.task.spec.baselines
    lrs, sweeps, kappas, forced = from_rows(rows)
    table = _tables(lrs, sweeps, kappas, forced, spec, config.optim.learning_rate)
    verdict = _verdict(lrs, sweeps, kappas, forced, spec)
    return record.analysis("qk_norm", "S6", rows, table, verdict, ["summary.png"])


def _best(sweep: dict[str, np.ndarray]) -> int:
    """The learning rate with the lowest mean validation loss (a NaN run: never)."""
    return int(np.nanargmin(np.nan_to_num(sweep["valid_loss"], nan=np.inf).mean(axis=1)))


def _peak(sweep: dict[str, np.ndarray]) -> tuple[float, int]:
    logits = np.nan_to_num(sweep["attention_max_logit"], nan=np.inf).mean(axis=1)
    return float(logits.max()), int(logits.argmax())


def _tables(lrs, sweeps, kappas, forced, spec, forced_lr: float) -> str:
    rows = [[f"{lr:g}", *(f"{sweeps[qk][m][i].mean():.3g}" for qk in sweeps for m in METRICS)]
            for i, lr in enumerate(lrs)]  # fmt: skip
    head = ["learning rate", "loss, no QK-norm", "max logit, no QK-norm", "loss, QK-norm",
            "max logit, QK-norm"]  # fmt: skip
    summary = []
    for qk, sweep in sweeps.items():
        sens, (peak, at) = lr_sensitivity(sweep["loss"], sweep["loss0"]), _peak(sweep)
        best = _best(sweep)
        summary.append([
            "QK-norm" if qk else "no QK-norm", f"{sweep['loss0'].mean():.3f}",
            f"{sweep['loss'][best].mean():.3f} (lr {lrs[best]:g})",
            f"{sens.mean():.3f} ({', '.join(f'{s:.3f}' for s in sens)})",
            f"{peak:.3g} (lr {lrs[at]:g})",
        ])  # fmt: skip
    forced_rows = [[f"{k:g}", f"{forced['attention_max_logit'][i].mean():.3g}",
                    f"{forced['loss'][i].mean():.3f}",
                    f"{forced['loss'][i].mean() - spec['bigram_loss']:+.3f}"]
                   for i, k in enumerate(kappas)]  # fmt: skip
    return "\n\n".join([
        "Final test loss (nats) and max attention logit per learning rate (mean over seeds):",
        markdown_table(head, rows),
        "Per variant: loss₀ (at initialization), best loss (test loss at the rate with the "
        "lowest validation loss), LR sensitivity (mean; per seed), "
        "peak max logit:",
        markdown_table(["variant", "loss₀", "best loss", "LR sensitivity", "peak max logit"],
                       summary),
        f"Forced logits g(z) = √κ·z/√E[z²] on q and k (lr {forced_lr:g}), bigram loss "
        f"{spec['bigram_loss']:.3f}, entropy rate {spec['entropy_rate']:.3f}:",
        markdown_table(["κ", "max logit", "loss", "loss − bigram"], forced_rows),
    ])  # fmt: skip


def _verdict(lrs, sweeps, kappas, forced, spec) -> tuple[str, str]:
    sens = {qk: lr_sensitivity(s["loss"], s["loss0"]) for qk, s in sweeps.items()}
    peak = {qk: _peak(s)[0] for qk, s in sweeps.items()}
    lowers, raises = np.all(sens[True] < sens[False]), np.all(sens[True] > sens[False])
    caps = peak[True] <= CAP * peak[False]
    loss = {k: float(forced["loss"][i].mean()) for i, k in enumerate(kappas)}
    degrades = loss[1e3] - min(loss.values()) >= DEGRADED if 1e3 in loss else None
    worse = loss[1e4] > spec["bigram_loss"] if 1e4 in loss else None
    reason = (
        f"LR sensitivity (nats) without QK-norm {sens[False].mean():.3f}, with "
        f"{sens[True].mean():.3f} (lower for {int(np.sum(sens[True] < sens[False]))} of "
        f"{len(sens[True])} seeds); peak max logit over lr {lrs[0]:g}–{lrs[-1]:g}: "
        f"{peak[False]:.3g} without, {peak[True]:.3g} with (ratio {peak[True] / peak[False]:.2g},"
        f" cap ≤ {CAP}). Forced logits: loss "
        + ", ".join(f"{v:.3f} at κ = {k:g}" for k, v in loss.items())
        + f" (bigram {spec['bigram_loss']:.3f}); degrades near 1e3: "
        f"{'yes' if degrades else 'no'}; worse than bigram near 1e4: {'yes' if worse else 'no'}."
    )
    if lowers and caps:
        return "supported", reason
    if raises or peak[True] >= peak[False]:
        return "refuted", reason
    return "inconclusive", reason


def _plot(lrs, sweeps, kappas, forced, spec, path: Path) -> None:
    fig, (ax1, ax2, ax3) = new_figure(1, 3, figsize=(15, 4))
    for qk, sweep in sweeps.items():
        name = "QK-norm" if qk else "no QK-norm"
        (line,) = ax1.plot(lrs, sweep["loss"].mean(axis=1), "o-", ms=4, label=name)
        ax1.axhline(sweep["loss0"].mean(), color=line.get_color(), ls=":", lw=1,
                    label=f"{name}: loss at init")  # fmt: skip
        ax2.plot(lrs, sweep["attention_max_logit"].mean(axis=1), "o-", ms=4, label=name)
    ax3.plot(kappas, forced["loss"].mean(axis=1), "o-", ms=4, label="forced logits")
    for k, loss, top in zip(kappas, *(forced[m].mean(axis=1) for m in METRICS), strict=True):
        ax3.annotate(f"max logit {top:.3g}", (k, loss), fontsize=7, rotation=30)
    ax3.set_xscale("log")
    ax3.set_xlabel("κ in g(z) = √κ·z/√E[z²]")
    for ax in (ax1, ax3):
        ax.axhline(spec["bigram_loss"], color="gray", ls="--", lw=1, label="bigram loss")
        ax.axhline(spec["entropy_rate"], color="k", ls="--", lw=1, label="entropy rate")
        ax.set_ylabel("final test loss (nats)")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
    ax2.set_yscale("log")
    ax2.set_ylabel("max attention logit")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path, "QK-LayerNorm, order-2 Markov language, small causal transformer")
