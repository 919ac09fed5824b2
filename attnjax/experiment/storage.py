"""Run-folder files: config and environment records, metrics log, results table, checkpoints.

Nothing here pickles: JSON, CSV and orbax array checkpoints only.
"""

import csv
import io
import json
import os
import platform
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed over it), so another
    process reading ``path`` sees the old file or the new one, never half of one; an
    interrupted write leaves no temporary file behind."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def environment() -> dict[str, Any]:
    """Versions, platform, device count, the git commit of the working directory and whether
    its code (``attnjax/``, ``configs/``, ``experiments/``) had uncommitted changes; call it
    when the run starts."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", "attnjax", "configs", "experiments")
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "platform": jax.default_backend(),
        "device_count": jax.device_count(),
        "git_commit": commit and commit.strip(),
        "git_dirty": None if status is None else bool(status.strip()),
    }


class MetricsLog:
    """``metrics.jsonl``: one JSON row per (run, step, split, metric). Opening it for a resume
    at ``resume_step`` drops the rows written after that step's checkpoint."""

    def __init__(self, path: Path, resume_step: int):
        self.path = path
        rows = read_jsonl(path) if path.exists() else []
        self._write([r for r in rows if r["step"] <= resume_step], "w")

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        self._write(rows, "a")

    def _write(self, rows: Sequence[dict[str, Any]], mode: str) -> None:
        with self.path.open(mode) as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)


class TensorBoardLog:
    """TensorBoard scalars of every run (seed, learning rate), each in its own folder
    ``<folder>/seed=<s>_lr=<lr>/``, tagged ``<split>/<metric>``: a view of ``metrics.jsonl``,
    which stays the record. Needs tensorboardX (:func:`require_tensorboard`)."""

    def __init__(self, folder: Path, seeds: Sequence[int], learning_rates: Sequence[float]):
        require_tensorboard()
        from tensorboardX import SummaryWriter

        self.writers = {
            (s, lr): SummaryWriter(str(folder / f"seed={s}_lr={lr:g}"))
            for s, lr in zip(seeds, learning_rates, strict=True)
        }

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        for r in rows:
            writer = self.writers[(r["seed"], r["learning_rate"])]
            writer.add_scalar(f"{r['split']}/{r['metric']}", r["value"], r["step"])

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def require_tensorboard() -> None:
    """An ``ImportError`` naming the install command (the README's) without tensorboardX."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "train.tensorboard (--tensorboard): needs tensorboardX, which is not installed; "
            'install it with pip install -e ".[tensorboard]"'
        ) from error


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows to CSV; columns in first-seen order across rows."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def parse_csv(text: str) -> list[dict[str, str]]:
    """:func:`read_csv` of a CSV's text."""
    return list(csv.DictReader(io.StringIO(text)))


# Orbax's finalization of concurrent saves from several threads (a sweep trains points in
# parallel) can race on its temporary folders: saves and restores take turns.
_ORBAX_LOCK = threading.Lock()


class Checkpoints:
    """The latest training state in ``directory`` (orbax, synchronous saves), typed PRNG keys
    stored as key data."""

    def __init__(self, directory: Path):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=1, create=True, enable_async_checkpointing=False
        )
        self._manager = ocp.CheckpointManager(directory.absolute(), options=options)

    def latest_step(self) -> int:
        return self._manager.latest_step() or 0

    def save(self, step: int, state: Any) -> None:
        with _ORBAX_LOCK:
            self._manager.save(step, args=ocp.args.StandardSave(_unwrap_keys(state)))
            self._manager.wait_until_finished()

    def restore(self, template: Any) -> Any:
        """The latest state, with the structure, dtypes and shardings of ``template``."""
        with _ORBAX_LOCK:
            restored = self._manager.restore(
                self._manager.latest_step(),
                args=ocp.args.StandardRestore(_unwrap_keys(template)),
            )
        return jax.tree.map(_rewrap_key, restored, template)

    def close(self) -> None:
        self._manager.close()


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unwrap_keys(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _rewrap_key(restored: Any, template: Any) -> Any:
    if _is_key(template):
        return jax.random.wrap_key_data(restored, impl=jax.random.key_impl(template))
    return restored
