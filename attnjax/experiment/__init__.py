"""Typed configs, the vectorized trainer, run folders, sweeps, their reports and records."""

import importlib.util
from pathlib import Path
from types import ModuleType

from attnjax.experiment.config import (
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    from_dict,
    parse_value,
    with_overrides,
)
from attnjax.experiment.record import Analysis
from attnjax.experiment.run import load_run, train_and_evaluate
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
    "combine",
    "from_dict",
    "grid",
    "label",
    "load_file",
    "load_run",
    "parse_value",
    "sweep",
    "train_and_evaluate",
    "with_overrides",
]
