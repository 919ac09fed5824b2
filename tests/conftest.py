"""Every test runs with implicit rank promotion as an error, as JAX's own test harness does:
attnjax broadcasts explicitly, so it works under ``jax.numpy_rank_promotion("raise")``."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _no_rank_promotion():
    with jax.numpy_rank_promotion("raise"):
        yield
