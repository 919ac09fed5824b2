"""Every test runs with implicit rank promotion as an error, as JAX's own test harness does:
attnjax broadcasts explicitly, so it works under ``jax.numpy_rank_promotion("raise")``. XLA
compiles at the fast setting of ``tests/cpu.py``, into JAX's persistent compilation cache."""

import os

import jax
import pytest

from tests.cpu import use_compile_cache, with_fast_compile

os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS"))
use_compile_cache(prune="PYTEST_XDIST_WORKER" not in os.environ)


@pytest.fixture(autouse=True)
def _no_rank_promotion():
    with jax.numpy_rank_promotion("raise"):
        yield
