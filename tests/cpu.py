"""XLA settings of the test processes. The suite compiles far more than it computes (small
shapes, many programs), so it compiles at XLA's CPU backend optimization level 0: about half
the compile time, the same results within the tests' tolerances. Subprocesses that need
several CPU devices get the same setting. Every compiled program goes to JAX's persistent
compilation cache (:func:`use_compile_cache`), so a rerun on the same machine skips XLA's
compilation."""

import os
import shutil
from pathlib import Path

import jax

from attnjax.cli import cache_folder

FAST_COMPILE = "--xla_backend_optimization_level=0"


def with_fast_compile(flags: str | None) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with :data:`FAST_COMPILE` added."""
    return f"{flags or ''} {FAST_COMPILE}".strip()


def subprocess_env(devices: int | None = None, **variables: str) -> dict[str, str]:
    """This process's environment for a subprocess with ``devices`` CPU devices (default one),
    fast compilation and ``variables``."""
    count = f"--xla_force_host_platform_device_count={devices}" if devices else ""
    return {**os.environ, "XLA_FLAGS": with_fast_compile(count), **variables}


CACHE_LIMIT = 2**31  # bytes: a larger test cache is emptied when the suite starts
CACHE_SETTINGS = {  # JAX's names, as jax.config and the environment take them
    "jax_persistent_cache_min_compile_time_secs": 0.0,  # every program, however quick
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


def use_compile_cache(prune: bool) -> None:
    """JAX's persistent compilation cache for this process and, through the environment, its
    subprocesses: every program (JAX's default skips those compiled in under a second), in
    ``JAX_COMPILATION_CACHE_DIR`` if set, else attnjax's ``jax-tests`` folder in the user's
    cache (apart from the CLI's ``jax``). The cache key covers the program, the XLA flags and
    the versions, so a hit is the executable a compilation would give; tracing and lowering
    still run. ``prune`` (the suite's first process): empty a folder over
    :data:`CACHE_LIMIT`. ``ATTNJAX_COMPILE_CACHE=0``: off."""
    if os.environ.get("ATTNJAX_COMPILE_CACHE", "1") == "0":
        return
    folder = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_folder("jax-tests"))
    if prune and folder.is_dir():
        if sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) > CACHE_LIMIT:
            shutil.rmtree(folder, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    for name, value in CACHE_SETTINGS.items():
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)
