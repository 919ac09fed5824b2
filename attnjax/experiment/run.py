"""One config, trained for several seeds (and learning rates) at once, into a run folder.

``<workdir>/`` holds ``config.json`` (the resolved config and the runs), ``metrics.jsonl``,
``results.csv`` (one row per run: seed, learning rate, parameter count, FLOPs per step, final
metrics), ``report.md``, ``curves.png``, ``attention.png`` and ``attention.npz`` (run 0's
attention maps on one example, ``layer_<i>`` of shape ``[N, T, S]``, for models with
attention), ``env.json``, ``checkpoints/`` (orbax), with ``train.tensorboard``
``tensorboard/`` and, with ``train.patching``, ``patching.png`` and ``patching.npz`` (run 0's
activation patching tables, :func:`patching_tables`). Running the
same call again resumes from the last checkpoint and ends with the same results.
"""

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jaxtyping import Array

from attnjax.analysis.pruning import attention_maps
from attnjax.experiment import report, storage
from attnjax.experiment.config import ExperimentConfig, from_dict
from attnjax.experiment.trainer import QUICK, Runs, Trainer, collect, gather, get_trainer
from attnjax.inspect import PatchingTable, patch_heads, patch_positions, tables_figure


def train_and_evaluate(
    config: ExperimentConfig,
    workdir: str | Path,
    *,
    num_seeds: int = 1,
    learning_rates: Sequence[float] | None = None,
    fields: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
    trainer: Trainer | None = None,
    smoke: bool = False,
) -> list[dict[str, Any]]:
    """Train ``num_seeds`` seeds (from ``config.train.seed``) × ``learning_rates`` (default: the
    config's) in one vectorized program; return the rows of ``results.csv``.

    ``fields`` are extra columns for every row (a sweep passes the point's overrides). An
    existing folder with the same config resumes; with another config it is a
    ``FileExistsError`` unless ``overwrite`` (which removes the run's own files, ``RUN_FILES``,
    and nothing else). ``progress(step, total, loss)`` is called after every chunk of steps
    with the chunk's mean training loss over runs. ``trainer`` (a :class:`Trainer` built for
    ``config``, e.g. a subclass that changes every run's model) replaces the default one: the
    trainer computes, this function keeps the run folder (checkpoints, logs, reports).
    ``smoke`` (a run that only checks the code runs) says so in the report's and figures'
    titles. A missing optional dependency is an ``ImportError`` before the folder is made.
    """
    workdir = Path(workdir)
    if config.train.tensorboard:
        storage.require_tensorboard()
    runs, record = _record(config, num_seeds, learning_rates)
    check_workdir(
        config, workdir, num_seeds=num_seeds, learning_rates=learning_rates, overwrite=overwrite
    )
    primary = jax.process_index() == 0  # across processes, one writes (all save checkpoints)
    if primary:
        if overwrite:
            remove_run(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        storage.write_json(workdir / "config.json", record)
    multihost_utils.sync_global_devices("attnjax run folder ready")
    environment = storage.environment()

    if trainer is not None and trainer.config != config:
        raise ValueError("trainer: built for another config than the one given")
    trainer = trainer or get_trainer(config)
    state, lrs = trainer.init(runs)
    checkpoints = storage.Checkpoints(workdir / "checkpoints")
    start = checkpoints.latest_step()
    if start:
        state = checkpoints.restore(state)
    log = storage.MetricsLog(workdir / "metrics.jsonl", resume_step=start) if primary else None
    train = config.train
    board = None
    if train.tensorboard and primary:
        board = storage.TensorBoardLog(workdir / "tensorboard", runs.seeds, runs.learning_rates)
    final = None  # the last evaluation, when this call trained
    for step in range(start, train.steps, train.eval_every):
        state, losses = trainer.train_chunk(state, runs, lrs, step)
        end = step + train.eval_every
        final = {split: trainer.evaluate(state, runs, split) for split in trainer.splits}
        rows = collect({"loss": gather(losses)}, runs, step=end, split="train")
        for split, metrics in final.items():
            rows += collect(metrics, runs, step=end, split=split)
        if log is not None:
            log.append(rows)
        if board is not None:
            board.append(rows)
        checkpoints.save(end, state)
        if progress:
            progress(end, train.steps, float(np.nanmean(gather(losses))))
    checkpoints.close()
    if board is not None:
        board.close()

    if final is None:  # a finished run, invoked again
        final = {split: trainer.evaluate(state, runs, split) for split in trainer.splits}
    results = _results(trainer, final, runs, dict(fields or {}))
    maps = [gather(m) for m in _attention_maps(trainer, (state.params, state.rest), run=0)]
    if not primary:
        return results
    storage.write_csv(workdir / "results.csv", results)
    storage.write_json(workdir / "env.json", environment)
    metrics = storage.read_jsonl(workdir / "metrics.jsonl")
    report.plot_curves(metrics, workdir / "curves.png", title=config.name, smoke=smoke)
    title = f"{config.name}: run 0 (seed {runs.seeds[0]}, lr {runs.learning_rates[0]:g})"
    if maps:
        report.plot_attention(maps, workdir / "attention.png", title=title, smoke=smoke)
        arrays = {f"layer_{i}": np.asarray(m[0]) for i, m in enumerate(maps)}
        np.savez(workdir / "attention.npz", **arrays)
    if maps and config.train.patching:
        tables = patching_tables(trainer, (state.params, state.rest), run=0)
        report.save_figure(tables_figure(tables), workdir / "patching.png", title, smoke)
        arrays = {f"{t.axes[1]}_{k}": np.asarray(getattr(t, k)) for t in tables
                  for k in ("values", "raw", "clean", "corrupted")}  # fmt: skip
        np.savez(workdir / "patching.npz", **arrays)
    (workdir / "report.md").write_text(report.run_report(config, results, smoke=smoke))
    return results


# What a run writes into its folder; --overwrite removes these and nothing else.
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "results.csv",
    "report.md",
    "curves.png",
    "attention.png",
    "attention.npz",
    "patching.png",
    "patching.npz",
    "env.json",
    "checkpoints",
    "tensorboard",
)


def _record(config: ExperimentConfig, num_seeds: int, learning_rates) -> tuple[Runs, dict]:
    """The runs, and ``config.json``'s content (as JSON reads it back)."""
    seeds = range(config.train.seed, config.train.seed + num_seeds)
    runs = Runs.grid(seeds, learning_rates or [config.optim.learning_rate])
    record = {
        "config": config.to_dict(),
        "seeds": runs.seeds,
        "learning_rates": runs.learning_rates,
    }
    return runs, json.loads(json.dumps(record))


def check_workdir(
    config: ExperimentConfig,
    workdir: str | Path,
    *,
    num_seeds: int = 1,
    learning_rates: Sequence[float] | None = None,
    overwrite: bool = False,
) -> None:
    """``FileExistsError`` if ``workdir`` holds a run of another config (or other seeds or
    rates) and ``overwrite`` is not set; the same config resumes, also when its
    ``config.json`` predates a field added since with its default."""
    path = Path(workdir) / "config.json"
    if overwrite or not path.exists():
        return
    if _stored_record(path) != _record(config, num_seeds, learning_rates)[1]:
        raise FileExistsError(
            f"workdir: {workdir} holds a run of another config; "
            "choose another folder or pass overwrite=True (--overwrite)"
        )


def _stored_record(path: Path) -> dict[str, Any]:
    """A run folder's ``config.json`` with its config read back by this version (fields added
    since take their defaults); as stored if this version cannot read it."""
    stored = storage.read_json(path)
    try:
        config = from_dict(stored["config"]).to_dict()
    except (KeyError, TypeError, ValueError):
        return stored  # not this version's config: compared as it is, it differs
    return stored | {"config": json.loads(json.dumps(config))}


def remove_run(workdir: str | Path) -> None:
    """Delete the files a run wrote (``RUN_FILES``), leaving anything else in the folder."""
    for name in RUN_FILES:
        path = Path(workdir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _results(
    trainer: Trainer, final: dict[str, dict[str, Any]], runs: Runs, fields: dict[str, Any]
) -> list[dict[str, Any]]:
    params, flops = trainer.param_count(), trainer.flops_per_step()
    return [
        fields
        | {"seed": seed, "learning_rate": lr, "params": params, "flops_per_step": flops}
        | {f"{split}_{name}": float(v[r]) for split, m in final.items() for name, v in m.items()}
        for r, (seed, lr) in enumerate(zip(runs.seeds, runs.learning_rates, strict=True))
    ]


def load_run(
    workdir: str | Path, run: int | tuple[int, float] = 0
) -> tuple[ExperimentConfig, nnx.Module, list[dict[str, Any]]]:
    """``(config, model, metrics)`` of a finished run folder; ``model`` is run ``run`` (an index
    into ``config.json``'s seeds × learning rates, or a ``(seed, learning_rate)`` pair) with
    its final parameters."""
    workdir = Path(workdir)
    record = storage.read_json(workdir / "config.json")
    config = from_dict(record["config"])
    runs = Runs(tuple(record["seeds"]), tuple(record["learning_rates"]))
    run = runs.index(*run) if isinstance(run, tuple) else run
    trainer = get_trainer(config)
    template, _ = trainer.init(runs)
    checkpoints = storage.Checkpoints(workdir / "checkpoints")
    params, rest, _ = checkpoints.restore(template)
    checkpoints.close()
    return (
        config,
        _model(trainer, (params, rest), run),
        storage.read_jsonl(workdir / "metrics.jsonl"),
    )


def _attention_maps(trainer: Trainer, params_rest: tuple[Any, Any], run: int) -> list[Array]:
    """Run ``run``'s attention weights ``[1, N, T, S]`` per layer on one example (key 0)."""

    def maps(params_rest):
        batch = trainer.task.generate(jax.random.key(0), 1, trainer.config.task)
        return attention_maps(_model(trainer, params_rest, run), batch)

    return jax.jit(maps, compiler_options=QUICK)(params_rest)


PATCH_BATCH = 64  # examples in each batch of the runner's patching tables


def patching_tables(
    trainer: Trainer, params_rest: tuple[Any, Any], run: int
) -> tuple[PatchingTable, PatchingTable]:
    """Run ``run``'s activation patching tables: each (layer, head) of ``attention.z`` and each
    (layer, position) of ``resid_pre`` patched from a clean task batch (key 0) into a
    corrupted one (key 1, another draw of the task), scored by minus the task's loss on the
    clean batch's targets (:func:`attnjax.inspect.patch_heads`, ``patch_positions``)."""
    model = _model(trainer, params_rest, run)
    task, task_config = trainer.task, trainer.config.task
    clean, corrupted = (task.generate(jax.random.key(i), PATCH_BATCH, task_config) for i in (0, 1))

    def metric(output, batch):
        return -task.loss(output, batch)

    return (
        patch_heads(model, clean, corrupted, metric),
        patch_positions(model, clean, corrupted, metric),
    )


def _model(trainer: Trainer, params_rest: tuple[Any, Any], run: int) -> nnx.Module:
    """Run ``run``'s model from the vectorized ``(params, rest)``, in evaluation mode (no
    dropout)."""
    model = nnx.merge(trainer.graphdef, *jax.tree.map(lambda x: x[run], params_rest))
    model.eval()
    return model
