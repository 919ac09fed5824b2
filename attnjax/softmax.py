"""A masked softmax in float32 that never produces NaN, with its log-sum-exp."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

# A large finite negative for masked logits: -inf arithmetic would give NaN in empty rows.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def masked_softmax_with_lse(
    logits: Float[ArrayLike, "... S"], mask: Bool[ArrayLike, "... S"] | None = None
) -> tuple[Float[Array, "... S"], Float[Array, "..."]]:
    """Softmax over the last axis, in float32, and its log-sum-exp.

    Masked entries (``mask`` False) get weight 0. A row with no valid entry gets weights 0,
    zero gradients, and log-sum-exp ``-inf``. Finite logits of any size never give NaN or inf
    weights: the row maximum is subtracted before exponentiating.
    """
    x = jnp.asarray(logits, jnp.float32)
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask, bool), x.shape)
        x = jnp.where(mask, x, MASK_VALUE)
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    e = jnp.exp(x - row_max)
    if mask is not None:
        e = jnp.where(mask, e, 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    nonempty = total > 0
    safe_total = jnp.where(nonempty, total, 1.0)
    lse = jnp.where(nonempty, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
    return e / safe_total, lse


def masked_softmax(
    logits: Float[ArrayLike, "... S"], mask: Bool[ArrayLike, "... S"] | None = None
) -> Float[Array, "... S"]:
    """:func:`masked_softmax_with_lse` without the log-sum-exp."""
    return masked_softmax_with_lse(logits, mask)[0]
