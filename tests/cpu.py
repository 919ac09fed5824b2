"""XLA settings of the test processes. The suite compiles far more than it computes (small
shapes, many programs), so it compiles at XLA's CPU backend optimization level 0: about half
the compile time, the same results within the tests' tolerances. Subprocesses that need
several CPU devices get the same setting."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"


def with_fast_compile(flags: str | None) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with :data:`FAST_COMPILE` added."""
    return f"{flags or ''} {FAST_COMPILE}".strip()


def subprocess_env(devices: int | None = None, **variables: str) -> dict[str, str]:
    """This process's environment for a subprocess with ``devices`` CPU devices (default one),
    fast compilation and ``variables``."""
    count = f"--xla_force_host_platform_device_count={devices}" if devices else ""
    return {**os.environ, "XLA_FLAGS": with_fast_compile(count), **variables}
