"""A masked softmax in float32, with its log-sum-exp, and its online (tile by tile) form used
by the tiled implementations.

Non-finite logits behave as in ``jax.nn.softmax``: a NaN or ``+inf`` among a row's visible
logits makes the row NaN (its log-sum-exp too). A row with no visible key, or whose visible
logits are all ``-inf`` (a ``score_mod`` that masks by ``-inf``), gets weights 0, output 0
and log-sum-exp ``-inf``, never NaN: ``jax.nn`` gives NaN (``-inf`` row) or the mean of the
values (masked row) there. A row is empty exactly when its sum of exponentials is 0, so NaN
(which compares false to everything) is never mistaken for an empty row.
"""

from collections.abc import Callable

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

    Masked entries (``mask`` False) get weight 0. A row with no valid entry, or whose valid
    logits are all ``-inf``, gets weights 0, zero gradients, and log-sum-exp ``-inf``. Finite
    logits of any size never give NaN or inf weights: the row maximum is subtracted before
    exponentiating. NaN and ``+inf`` among the valid logits give a NaN row, as in ``jax.nn``.
    """
    x = jnp.asarray(logits, jnp.float32)
    visible = x != -jnp.inf  # -inf logits are masked keys: an all -inf row is empty
    mask = visible if mask is None else visible & jnp.broadcast_to(jnp.asarray(mask, bool), x.shape)
    x = jnp.where(mask, x, MASK_VALUE)
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    e = jnp.where(mask, jnp.exp(x - row_max), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    empty = total == 0
    safe_total = jnp.where(empty, 1.0, total)
    lse = jnp.where(empty, -jnp.inf, row_max + jnp.log(safe_total))[..., 0]
    return e / safe_total, lse


def masked_softmax(
    logits: Float[ArrayLike, "... S"], mask: Bool[ArrayLike, "... S"] | None = None
) -> Float[Array, "... S"]:
    """:func:`masked_softmax_with_lse` without the log-sum-exp."""
    return masked_softmax_with_lse(logits, mask)[0]


class RowStats:
    """Where the online softmax keeps a tile's row statistics (running max, running sum,
    log-sum-exp): one value per row, ``[..., Tb]``. A kernel whose vectors must stay 2-D
    (Mosaic) subclasses it with its own layout (:class:`attnjax.pallas.tpu.LaneStats`)."""

    @staticmethod
    def reduce(fn: Callable, x: Array) -> Array:
        """``fn`` (``jnp.max``, ``jnp.sum``) over each row of ``x [..., Tb, Sb]``."""
        return fn(x, axis=-1)

    @staticmethod
    def widen(stats: Array, width: int) -> Array:
        """Row statistics broadcastable against ``[..., Tb, width]``."""
        del width
        return stats[..., None]


def online_init(rows: tuple[int, ...], value_dim: int) -> tuple[Array, Array, Array]:
    """The online softmax's start: running max, running sum, accumulator ``[*rows, Hv]``."""
    return (
        jnp.full(rows, MASK_VALUE, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros((*rows, value_dim), jnp.float32),
    )


def online_step(carry, logits: Array, mask: Array | None, weighted_sum: Callable, stats=RowStats):
    """Fold one tile of float32 ``logits [..., Tb, Sb]`` into the running softmax.

    ``weighted_sum(p [..., Tb, Sb]) -> [..., Tb, Hv]`` multiplies the tile's unnormalized
    probabilities with its values. Masked entries get probability exactly 0, also while
    every key seen so far was masked. ``stats``: the layout of the running max and sum.
    """
    m_prev, total, acc = carry
    if mask is not None:
        logits = jnp.where(mask, logits, MASK_VALUE)
    m_new = jnp.maximum(m_prev, stats.reduce(jnp.max, logits))
    p = jnp.exp(logits - stats.widen(m_new, logits.shape[-1]))
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    alpha = jnp.exp(m_prev - m_new)
    new_total = alpha * total + stats.reduce(jnp.sum, p)
    return m_new, new_total, stats.widen(alpha, acc.shape[-1]) * acc + weighted_sum(p)


def online_finish(carry, stats=RowStats) -> tuple[Array, Array]:
    """``(output [..., Hv], lse [...])``; a row that saw no valid key (or only ``-inf``
    logits) gives 0 and ``-inf``, selected (never a product with 0, so whatever its
    accumulator holds); a NaN row stays NaN."""
    m, total, acc = carry
    empty = total == 0
    safe_total = jnp.where(empty, 1.0, total)
    width = acc.shape[-1]
    out = jnp.where(stats.widen(total, width) == 0, 0.0, acc / stats.widen(safe_total, width))
    return out, jnp.where(empty, -jnp.inf, m + jnp.log(safe_total))


def recomputed_probs(logits: Array, lse: Array, mask: Array | None, stats=RowStats) -> Array:
    """The softmax of a tile from its logits and the rows' log-sum-exp (``-inf``: empty row).

    An empty row's probabilities are 0, also without a mask.
    """
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse)
    p = jnp.exp(logits - stats.widen(lse, logits.shape[-1]))
    return p if mask is None else jnp.where(mask, p, 0.0)
