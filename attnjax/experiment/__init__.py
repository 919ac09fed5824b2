"""Typed configs, the vectorized trainer, run folders, sweeps, their reports and records."""

import importlib.util
from pathlib import Path
from types import ModuleType

from attnjax.experiment.config import (
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    from_dict,
    parse_overrides,
    parse_typed,
    with_overrides,
)
from attnjax.experiment.parts import Check, Part
from attnjax.experiment.rates import AutoRates
from attnjax.experiment.record import Analysis
from attnjax.experiment.run import check_workdir, load_run, train_and_evaluate
from attnjax.experiment.sweep import (
    Experiment,
    Outcome,
    Stats,
    Summary,
    combine,
    grid,
    label,
    sweep,
)
from attnjax.experiment.trainer import Runs, Trainer


def load_file(path: str | Path) -> ModuleType:
    """Import a config or experiment file. It is Python code: load only files you trust."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"file: {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"attnjax_user_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(module: ModuleType, variant: str | None = None) -> ExperimentConfig:
    """``module.get_config(variant)`` for a variant the config file declares in ``VARIANTS``
    (default ``("smoke",)``); any other, or a file without ``get_config`` (an experiment
    file), is a ``ValueError`` saying so."""
    if not callable(getattr(module, "get_config", None)):
        sweep_file = file_kind(module) == "sweep"
        hint = "; an experiment file runs with `attnjax sweep`" if sweep_file else ""
        raise ValueError(f"config: {module.__file__} defines no get_config(variant){hint}")
    variants = tuple(getattr(module, "VARIANTS", ("smoke",)))
    if variant is not None and variant not in variants:
        raise ValueError(
            f"--variant: {variant!r} is not a variant of {Path(module.__file__).name}; "
            f"expected one of {list(variants)}"
        )
    return module.get_config(variant)


def file_kind(module: ModuleType) -> str | None:
    """``"run"`` for a config file (``get_config``), ``"sweep"`` for an experiment file
    (``get_experiment`` and/or ``analyze``), else None."""
    if hasattr(module, "get_experiment") or hasattr(module, "analyze"):
        return "sweep"
    return "run" if hasattr(module, "get_config") else None


__all__ = [
    "Analysis",
    "AutoRates",
    "Check",
    "Experiment",
    "ExperimentConfig",
    "OptimConfig",
    "Outcome",
    "Part",
    "Runs",
    "Stats",
    "Summary",
    "TrainConfig",
    "Trainer",
    "check_workdir",
    "combine",
    "file_kind",
    "from_dict",
    "get_config",
    "grid",
    "label",
    "load_file",
    "load_run",
    "parse_overrides",
    "parse_typed",
    "sweep",
    "train_and_evaluate",
    "with_overrides",
]
