"""Diagnostics of attention maps, pure and jittable.

``weights`` are attention maps ``[..., T, S]`` (rows sum to 1, or 0 for rows with no visible
key); a heads axis, where one is needed, is ``-3`` as in ``[B, N, T, S]``.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


def entropy(weights: Float[ArrayLike, "... S"]) -> Float[Array, "..."]:
    """Shannon entropy of each row in nats (0 log 0 = 0): ``log S`` for uniform, 0 for one-hot."""
    w = jnp.asarray(weights, jnp.float32)
    return -jnp.sum(jnp.where(w > 0, w * jnp.log(jnp.where(w > 0, w, 1.0)), 0.0), axis=-1)


def max_logit(logits: Float[ArrayLike, "..."]) -> Float[Array, ""]:
    """The largest attention logit (Dehghani et al., 2023 track it as a divergence signal)."""
    return jnp.max(jnp.asarray(logits, jnp.float32))


def max_logit_from_softmax(
    weights: Float[ArrayLike, "... T S"], lse: Float[ArrayLike, "... T"]
) -> Float[Array, ""]:
    """The largest logit of the rows with a visible key, from softmax weights and log-sum-exp.

    ``weights`` and ``lse`` as ``attention(..., return_weights=True, return_residual=True)``
    returns them: ``w_s = exp(z_s - lse)``, so ``max_s z_s = lse + log max_s w_s``. ``-inf`` if
    no row has a visible key (all-zero weights)."""
    top = jnp.max(jnp.asarray(weights, jnp.float32), axis=-1)
    rows = jnp.asarray(lse, jnp.float32) + jnp.log(jnp.where(top > 0, top, 1.0))
    return jnp.max(jnp.where(top > 0, rows, -jnp.inf))


def saturation(weights: Float[ArrayLike, "... T S"], threshold: float = 0.99) -> Float[Array, ""]:
    """Fraction of rows whose largest weight exceeds ``threshold``."""
    return jnp.mean(jnp.max(jnp.asarray(weights), axis=-1) > threshold)


def softmax_jacobian_norm(weights: Float[ArrayLike, "... S"]) -> Float[Array, "..."]:
    """Frobenius norm of the softmax Jacobian ``diag(y) - y yᵀ`` of each row.

    ``‖J‖²_F = Σ yᵢ² − 2 Σ yᵢ³ + (Σ yᵢ²)²``: 0 for one-hot rows, ``≈ 1/√S`` for uniform ones.
    """
    y = jnp.asarray(weights, jnp.float32)
    sq = jnp.sum(y**2, axis=-1)
    return jnp.sqrt(jnp.maximum(sq - 2 * jnp.sum(y**3, axis=-1) + sq**2, 0.0))


def head_similarity(weights: Float[ArrayLike, "*B N T S"]) -> Float[Array, "N N"]:
    """Cosine similarity of the heads' flattened attention maps (over batch, T and S)."""
    w = jnp.moveaxis(jnp.asarray(weights, jnp.float32), -3, 0)
    flat = w.reshape(w.shape[0], -1)
    unit = flat / jnp.sqrt(jnp.sum(flat**2, axis=-1, keepdims=True) + 1e-24)  # 0 maps -> 0
    return unit @ unit.T


def effective_rank(matrix: Float[ArrayLike, "... T S"]) -> Float[Array, "..."]:
    """``exp`` of the entropy of the normalized singular values (Roy & Vetterli, 2007)."""
    sv = jnp.linalg.svd(jnp.asarray(matrix, jnp.float32), compute_uv=False)
    p = sv / jnp.maximum(jnp.sum(sv, axis=-1, keepdims=True), 1e-12)
    return jnp.exp(entropy(p))


def gradient_norm_by_position(
    fn: Callable[[Array], Array], inputs: Float[ArrayLike, "T D"], output_position: int
) -> Float[Array, " T"]:
    """``‖∂ fn(inputs)[output_position] / ∂ inputs[s]‖`` for every input position ``s``.

    ``fn`` maps a sequence ``[T, D]`` to a sequence ``[T, C]``; the norm is the Frobenius norm of
    the ``[C, D]`` Jacobian block, so it does not depend on a chosen output direction.
    """
    inputs = jnp.asarray(inputs)
    jac = jax.jacrev(lambda x: fn(x)[output_position])(inputs)  # [C, T, D]
    return jnp.sqrt(jnp.sum(jac**2, axis=(0, 2)))


def cosine_weight_bound(scale: ArrayLike, num_keys: int) -> Array:
    """The largest attention weight cosine logits ``scale · cos(q, k) ∈ [-scale, scale]`` allow
    among ``num_keys`` keys: ``e^{2g} / (e^{2g} + n − 1)`` for ``g = |scale|``, reached when one
    key is at cosine 1 and every other at cosine −1 (0.105 for g = 1, n = 64)."""
    g = jnp.abs(jnp.asarray(scale, jnp.float32))
    return 1.0 / (1.0 + (num_keys - 1) * jnp.exp(-2.0 * g))
