"""Boolean attention masks (True = may attend), written once as rules of (query, key) index.

Each rule takes query indices ``q_idx [Tb]`` and key indices ``k_idx [Sb]`` and returns a mask
broadcastable to ``[B, N, Tb, Sb]``. Evaluated on ``arange(T), arange(S)`` it is the full mask
the dense path uses; evaluated on one block of indices it is that block's mask for the tiled
paths. :class:`MaskSpec` bundles the rules of one attention call.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int

BlockMask = Bool[Array, "#B #N Tb Sb"]


def causal(
    q_idx: Int[ArrayLike, " Tb"], k_idx: Int[ArrayLike, " Sb"], offset: Int[ArrayLike, ""] = 0
) -> BlockMask:
    """Key ``s`` is visible to query ``t`` iff ``s <= t + offset``.

    ``offset = 0`` is top-left aligned like ``jax.nn``; ``offset = S - T`` places the queries at
    the end of the key sequence (one-token decoding: ``T = 1``, ``offset = S - 1``).
    """
    q_pos = jnp.asarray(q_idx)[:, None] + offset
    return (jnp.asarray(k_idx)[None, :] <= q_pos)[None, None]


def local_window(
    q_idx: Int[ArrayLike, " Tb"],
    k_idx: Int[ArrayLike, " Sb"],
    window: int | tuple[int, int],
    offset: Int[ArrayLike, ""] = 0,
) -> BlockMask:
    """Key ``s`` is visible iff ``p - left <= s <= p + right`` where ``p = t + offset``.

    ``window`` is ``(left, right)`` or one int for both, as in ``jax.nn.dot_product_attention``.
    """
    left, right = (window, window) if isinstance(window, int) else window
    diff = jnp.asarray(k_idx)[None, :] - (jnp.asarray(q_idx)[:, None] + offset)
    return ((diff >= -left) & (diff <= right))[None, None]


def lengths(
    q_idx: Int[ArrayLike, " Tb"],
    k_idx: Int[ArrayLike, " Sb"],
    q_lengths: Int[ArrayLike, " B"] | None = None,
    kv_lengths: Int[ArrayLike, " B"] | None = None,
) -> BlockMask:
    """Padding: query ``t < q_lengths[b]`` and key ``s < kv_lengths[b]`` are valid."""
    mask = jnp.ones((1, 1, 1, 1), bool)
    if q_lengths is not None:
        valid_q = jnp.asarray(q_idx)[None, :] < jnp.asarray(q_lengths)[:, None]
        mask = mask & valid_q[:, None, :, None]
    if kv_lengths is not None:
        valid_k = jnp.asarray(k_idx)[None, :] < jnp.asarray(kv_lengths)[:, None]
        mask = mask & valid_k[:, None, None, :]
    return mask


def segments(
    q_idx: Int[ArrayLike, " Tb"],
    k_idx: Int[ArrayLike, " Sb"],
    q_segment_ids: Int[ArrayLike, "B T"],
    kv_segment_ids: Int[ArrayLike, "B S"],
) -> BlockMask:
    """Packed sequences: query and key must carry the same segment id."""
    q_seg = jnp.take(jnp.asarray(q_segment_ids), jnp.asarray(q_idx), axis=1)
    kv_seg = jnp.take(jnp.asarray(kv_segment_ids), jnp.asarray(k_idx), axis=1)
    return (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]


def combine(*masks: Bool[ArrayLike, "..."] | None) -> Bool[Array, "..."] | None:
    """Logical and of broadcastable masks, ignoring ``None`` (all ``None`` gives ``None``)."""
    present = [jnp.asarray(m, bool) for m in masks if m is not None]
    return functools.reduce(jnp.logical_and, present) if present else None


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["offset", "q_lengths", "kv_lengths", "q_segment_ids", "kv_segment_ids"],
    meta_fields=["is_causal", "window"],
)
@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """The structured mask rules of one attention call (a pytree: arrays are leaves).

    ``offset`` shifts query positions into the key sequence for the causal and window rules.
    """

    is_causal: bool = False
    window: tuple[int, int] | None = None
    offset: Int[ArrayLike, ""] = 0
    q_lengths: Int[Array, " B"] | None = None
    kv_lengths: Int[Array, " B"] | None = None
    q_segment_ids: Int[Array, "B T"] | None = None
    kv_segment_ids: Int[Array, "B S"] | None = None

    def block(self, q_idx: Int[ArrayLike, " Tb"], k_idx: Int[ArrayLike, " Sb"]) -> BlockMask | None:
        """The mask of the block ``q_idx × k_idx``, or ``None`` when no rule is active."""
        return combine(
            causal(q_idx, k_idx, self.offset) if self.is_causal else None,
            local_window(q_idx, k_idx, self.window, self.offset)
            if self.window is not None
            else None,
            lengths(q_idx, k_idx, self.q_lengths, self.kv_lengths)
            if self.q_lengths is not None or self.kv_lengths is not None
            else None,
            segments(q_idx, k_idx, self.q_segment_ids, self.kv_segment_ids)
            if self.q_segment_ids is not None
            else None,
        )

    def full(self, num_queries: int, num_keys: int) -> BlockMask | None:
        """The mask over all ``T × S`` positions."""
        return self.block(jnp.arange(num_queries), jnp.arange(num_keys))
