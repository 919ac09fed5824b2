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
    (default ``("smoke",)``); any other is a ``ValueError`` listing them."""
    variants = tuple(getattr(module, "VARIANTS", ("smoke",)))
    if variant is not None and variant not in variants:
        raise ValueError(
            f"--variant: {variant!r} is not a variant of {Path(module.__file__).name}; "
            f"expected one of {list(variants)}"
        )
    return module.get_config(variant)


__all__ = [
    "Analysis",
    "Experiment",
    "ExperimentConfig",
    "OptimConfig",
    "Outcome",
    "Runs",
    "Stats",
    "Summary",
    "TrainConfig",
    "Trainer",
    "check_workdir",
    "combine",
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
