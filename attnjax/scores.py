"""Attention scoring functions: pure maps ``(q [..., T, H], k [..., S, H]) -> logits [..., T, S]``.

Every logit ``(t, s)`` depends only on ``q[t]`` and ``k[s]``, so any block of logits can be
computed on its own (the tiled implementations rely on this). Leading batch dimensions of
``q``, ``k`` and the parameters broadcast against each other, so a parameter with a leading
head dimension ``[N, ...]`` applies one set of parameters per head of ``q [B, N, T, H]``.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

Logits = Float[Array, "*batch T S"]


def dot(q: Float[ArrayLike, "*batch T H"], k: Float[ArrayLike, "*batch S H"]) -> Logits:
    """``q · k``, unscaled."""
    return jnp.einsum("...th,...sh->...ts", q, k)


def scaled_dot(
    q: Float[ArrayLike, "*batch T H"],
    k: Float[ArrayLike, "*batch S H"],
    scale: Float[ArrayLike, "*#batch"] | float | None = None,
) -> Logits:
    """``scale · q · k``; ``scale`` defaults to ``1/sqrt(H)`` (Vaswani et al., 2017)."""
    if scale is None:
        scale = 1.0 / jnp.sqrt(jnp.shape(q)[-1])
    logits = dot(q, k)
    return logits * _per_batch(scale, logits.ndim - 2)


def bilinear(
    q: Float[ArrayLike, "*batch T H"],
    k: Float[ArrayLike, "*batch S H"],
    w: Float[ArrayLike, "*#batch H H"],
) -> Logits:
    """``qᵀ W k`` (Luong's "general" score)."""
    return jnp.einsum("...th,...hg,...sg->...ts", q, w, k)


def additive(
    q: Float[ArrayLike, "*batch T H"],
    k: Float[ArrayLike, "*batch S H"],
    w_q: Float[ArrayLike, "*#batch H A"],
    w_k: Float[ArrayLike, "*#batch H A"],
    v: Float[ArrayLike, "*#batch A"],
    b: Float[ArrayLike, "*#batch A"] | None = None,
    activation: Callable[[Array], Array] = jnp.tanh,
) -> Logits:
    """``vᵀ activation(W_qᵀ q + W_kᵀ k + b)`` (Bahdanau et al., 2015).

    Memory: one call materializes the hidden features ``[..., T, S, A]``; the tiled
    implementations compute them block by block instead.
    """
    hidden = (
        jnp.einsum("...th,...ha->...ta", q, w_q)[..., :, None, :]
        + jnp.einsum("...sh,...ha->...sa", k, w_k)[..., None, :, :]
    )
    if b is not None:
        hidden = hidden + _per_batch(b, hidden.ndim - 3, core=1)
    return jnp.einsum("...tsa,...a->...ts", activation(hidden), v)


def cosine(
    q: Float[ArrayLike, "*batch T H"],
    k: Float[ArrayLike, "*batch S H"],
    scale: Float[ArrayLike, "*#batch"] | float = 1.0,
    eps: float = 1e-6,
) -> Logits:
    """``scale · q·k / (max(‖q‖, eps) · max(‖k‖, eps))``, in ``[-scale, scale]``.

    The norm is ``sqrt(‖x‖² + eps²)``, a smooth stand-in for ``max(‖x‖, eps)`` whose
    gradient stays finite at ``x = 0`` (a zero vector scores 0 against everything).
    """
    logits = dot(_unit(q, eps), _unit(k, eps))
    return logits * _per_batch(scale, logits.ndim - 2)


def _unit(x: Float[ArrayLike, "... H"], eps: float) -> Float[Array, "... H"]:
    x = jnp.asarray(x)
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps * eps)


def _per_batch(x: ArrayLike, batch_ndim: int, core: int = 0) -> Array:
    """``x [*#batch, *core dims]`` with size-1 axes prefixed to ``batch_ndim`` batch dims and
    two appended for ``[T, S]`` before its ``core`` trailing dims: broadcasting made explicit
    (no implicit rank promotion)."""
    x = jnp.asarray(x)
    lead = (1,) * (batch_ndim + core - x.ndim)
    core_shape = x.shape[x.ndim - core :]
    return x.reshape(*lead, *x.shape[: x.ndim - core], 1, 1, *core_shape)


class ScoreSpec(NamedTuple):
    """How :func:`attnjax.attention` calls a named score with ``score_params``.

    ``params`` maps each parameter name to its trailing shape (``"H"`` = head size,
    ``"A"`` = any hidden size shared by the parameters); ``required`` names those that
    must be present. ``hidden``: the score forms hidden features ``[..., T, S, A]``, so tiled
    paths keep tiles small (``A`` is read from the parameters).
    """

    fn: Callable[..., Logits]
    params: dict[str, tuple[str, ...]]
    required: tuple[str, ...]
    hidden: bool = False


_ADDITIVE_PARAMS = {"w_q": ("H", "A"), "w_k": ("H", "A"), "v": ("A",), "b": ("A",)}
_ADDITIVE_REQUIRED = ("w_q", "w_k", "v")

SCORES: dict[str, ScoreSpec] = {
    "dot": ScoreSpec(dot, {}, ()),
    "scaled_dot": ScoreSpec(scaled_dot, {"scale": ()}, ()),
    "bilinear": ScoreSpec(bilinear, {"w": ("H", "H")}, ("w",)),
    "additive": ScoreSpec(additive, _ADDITIVE_PARAMS, _ADDITIVE_REQUIRED, hidden=True),
    "additive_relu": ScoreSpec(
        functools.partial(additive, activation=jax.nn.relu),
        _ADDITIVE_PARAMS,
        _ADDITIVE_REQUIRED,
        hidden=True,
    ),
    "cosine": ScoreSpec(cosine, {"scale": ()}, ()),
}
