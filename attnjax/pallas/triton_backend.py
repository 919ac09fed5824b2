"""JAX's Pallas Triton backend, which the GPU kernels use, and its deprecation.

JAX 0.11+ deprecates the backend in favour of Mosaic GPU (a ``DeprecationWarning`` each time a
Triton kernel lowers). attnjax knows, so :func:`quiet` filters exactly that warning around
attnjax's own lowering. Once a JAX release no longer ships ``jax.experimental.pallas.triton``,
:data:`pl_triton` is ``None``: the kernels still run in interpret mode off GPU, and
:func:`missing` names ``"chunked"`` and ``"cudnn"`` for ``implementation="pallas"`` on GPU.
"""

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import jax

try:
    from jax.experimental.pallas import triton as pl_triton
except ImportError:  # a JAX without the Pallas Triton backend
    pl_triton = None

# The start of the message JAX's Triton lowering warns with (jax-pallas-triton deprecation).
DEPRECATION_MESSAGE = r"The Pallas Triton backend is deprecated"


def compiler_params(num_warps: int, num_stages: int) -> Any:
    """Triton's compiler parameters, or ``None`` without the backend (interpret mode)."""
    if pl_triton is None:
        return None
    return pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def missing() -> str | None:
    """Why the Pallas kernels cannot run on GPU with this JAX, or ``None`` when they can."""
    if pl_triton is not None:
        return None
    return (
        f"implementation='pallas' on GPU needs JAX's Pallas Triton backend "
        f"(jax.experimental.pallas.triton), which jax {jax.__version__} no longer has; use "
        "implementation='chunked' (every score, mask and mod) or 'cudnn' (dot/scaled_dot "
        "without mods)"
    )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Ignore JAX's Triton-backend deprecation warning (only that one) inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATION_MESSAGE, category=DeprecationWarning)
        yield
