"""Penalties added to a training loss: head diversity and the output z-loss."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from attnjax.analysis.diagnostics import head_similarity


def cosine_diversity_penalty(weights: Float[ArrayLike, "*B N T S"]) -> Float[Array, ""]:
    """Mean pairwise cosine similarity of the heads' attention maps (``i ≠ j``); 0 if ``N = 1``."""
    sim = head_similarity(weights)
    n = sim.shape[0]
    off_diagonal = jnp.sum(sim) - jnp.trace(sim)
    return off_diagonal / max(n * (n - 1), 1)


def orthogonality_penalty(weights: Float[ArrayLike, "*B N T S"]) -> Float[Array, ""]:
    """``Σ_{i≠j} ‖A_i A_jᵀ‖²_F`` over head pairs, averaged over the batch dims."""
    a = jnp.asarray(weights, jnp.float32)
    gram = jnp.einsum("...its,...jus->...ijtu", a, a)
    sq = jnp.sum(gram**2, axis=(-1, -2))
    per_example = jnp.sum(sq, axis=(-1, -2)) - jnp.trace(sq, axis1=-2, axis2=-1)
    return jnp.mean(per_example)


def z_loss(logits: Float[ArrayLike, "... C"], weight: float = 1e-4) -> Float[Array, ""]:
    """``weight · mean(log² Z)`` with ``Z = Σ exp(logits)`` (Wortsman et al., 2023)."""
    return weight * jnp.mean(jax.nn.logsumexp(jnp.asarray(logits, jnp.float32), axis=-1) ** 2)
