"""Boolean attention masks (True = may attend), written once as rules of (query, key) index.

Each rule takes query indices ``q_idx [Tb]`` and key indices ``k_idx [Sb]`` and returns a mask
broadcastable to ``[B, N, Tb, Sb]``. Evaluated on ``arange(T), arange(S)`` it is the full mask
the dense path uses; evaluated on one block of indices it is that block's mask for the tiled
paths. :class:`MaskSpec` bundles the rules of one attention call and classifies tiles by them.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int, Int8

from attnjax.tiling import BlockSizes

TileMask = Bool[Array, "#B #N #Tb #Sb"]  # broadcastable to one tile [B, N, Tb, Sb]
# How a tile is masked: no position visible, some, or all (the order makes ``min`` an "and").
EMPTY, PARTIAL, FULL = 0, 1, 2
TileKinds = Int8[Array, "#B #N Tq Sk"]


def causal(
    q_idx: Int[ArrayLike, " Tb"], k_idx: Int[ArrayLike, " Sb"], offset: Int[ArrayLike, ""] = 0
) -> TileMask:
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
) -> TileMask:
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
) -> TileMask:
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
) -> TileMask:
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

    # A pytree: JAX rebuilds it with placeholder leaves, so runtime type checkers skip __init__.
    __no_type_check__ = True

    is_causal: bool = False
    window: tuple[int, int] | None = None
    offset: Int[ArrayLike, ""] = 0
    q_lengths: Int[Array, " B"] | None = None
    kv_lengths: Int[Array, " B"] | None = None
    q_segment_ids: Int[Array, "B T"] | None = None
    kv_segment_ids: Int[Array, "B S"] | None = None

    def block(self, q_idx: Int[ArrayLike, " Tb"], k_idx: Int[ArrayLike, " Sb"]) -> TileMask | None:
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

    @property
    def active(self) -> bool:
        """Whether any rule masks anything."""
        lengths = self.q_lengths is not None or self.kv_lengths is not None
        return (
            self.is_causal or self.window is not None or lengths or self.q_segment_ids is not None
        )

    def diff_bounds(self) -> tuple[int | None, int | None]:
        """Bounds on ``s - (t + offset)`` for a visible key, from the causal and window rules."""
        low, high = None, None
        if self.window is not None:
            low, high = -self.window[0], self.window[1]
        if self.is_causal:
            high = 0 if high is None else min(high, 0)
        return low, high

    def full(self, num_queries: int, num_keys: int) -> TileMask | None:
        """The mask over all ``T × S`` positions."""
        return self.block(jnp.arange(num_queries), jnp.arange(num_keys))

    def classify(self, num_queries: int, num_keys: int, blocks: BlockSizes) -> TileKinds:
        """Each tile's kind (EMPTY, PARTIAL, FULL) under these rules, ``[#B, 1, Tq, Sk]``.

        Exact for the causal, window and length rules; segment ids compare each tile's
        range of ids, so a tile may be called partial when it is not (never the reverse).
        Only positions inside ``T x S`` count: padding beyond them is masked elsewhere.
        """
        bq, bk = blocks.block_q, blocks.block_k
        q_lo = jnp.arange(0, num_queries, bq)
        k_lo = jnp.arange(0, num_keys, bk)
        q_hi, k_hi = jnp.minimum(q_lo + bq, num_queries) - 1, jnp.minimum(k_lo + bk, num_keys) - 1
        kinds = [jnp.full((1, 1, q_lo.size, k_lo.size), FULL, jnp.int8)]
        low, high = self.diff_bounds()
        if low is not None or high is not None:
            d_min = k_lo[None, :] - (q_hi[:, None] + self.offset)
            d_max = k_hi[None, :] - (q_lo[:, None] + self.offset)
            some, every = True, True
            if low is not None:
                some, every = some & (d_max >= low), every & (d_min >= low)
            if high is not None:
                some, every = some & (d_min <= high), every & (d_max <= high)
            kinds.append(_kind(some, every)[None, None])
        if self.q_lengths is not None or self.kv_lengths is not None:
            q_len = num_queries if self.q_lengths is None else self.q_lengths
            k_len = num_keys if self.kv_lengths is None else self.kv_lengths
            q_len, k_len = (jnp.reshape(n, (-1, 1, 1, 1)) for n in (q_len, k_len))
            rows, cols = (None, None, slice(None), None), (None, None, None, slice(None))
            some = (q_lo[rows] < q_len) & (k_lo[cols] < k_len)
            every = (q_hi[rows] < q_len) & (k_hi[cols] < k_len)
            kinds.append(_kind(some, every))
        if self.q_segment_ids is not None:
            q_min, q_max = _block_range(self.q_segment_ids, bq)
            k_min, k_max = _block_range(self.kv_segment_ids, bk)
            some = ~((q_max[:, :, None] < k_min[:, None]) | (k_max[:, None] < q_min[:, :, None]))
            every = (q_min == q_max)[:, :, None] & (k_min == k_max)[:, None] & some
            kinds.append(_kind(some, every)[:, None])
        return functools.reduce(jnp.minimum, kinds)


def _kind(some: Array, every: Array) -> Array:
    """EMPTY where no position is visible, FULL where all are, else PARTIAL."""
    return jnp.where(every, FULL, jnp.where(some, PARTIAL, EMPTY)).astype(jnp.int8)


def _block_range(ids: Int[Array, "B L"], block: int) -> tuple[Array, Array]:
    """Per-block minimum and maximum ``[B, L / block]`` of ids (the last block padded with
    its own last id)."""
    padded = -(-ids.shape[1] // block) * block
    ids = jnp.pad(ids, ((0, 0), (0, padded - ids.shape[1])), mode="edge")
    ids = ids.reshape(ids.shape[0], -1, block)
    return ids.min(axis=-1), ids.max(axis=-1)


def mod_indices(
    batch: int,
    heads: int,
    q_idx: Int[ArrayLike, " Tb"],
    k_idx: Int[ArrayLike, " Sb"],
    offset,
    extent: tuple[int, int] | None = None,
) -> tuple[Array, Array, Array, Array]:
    """``(b, h, q_idx, kv_idx)``, int32 and broadcastable to ``[B, N, Tb, Sb]``, as mods see
    them: absolute positions, the queries' shifted by ``offset`` into key coordinates.

    ``extent = (T, S)``: positions of a padded tile are clamped to ``T - 1`` and ``S - 1``
    first, so a mod never sees the padding beyond the sequences (its value there is the last
    real position's, finite wherever the mod is finite on real positions).
    """
    q_idx, k_idx = jnp.asarray(q_idx, jnp.int32), jnp.asarray(k_idx, jnp.int32)
    if extent is not None:
        q_idx, k_idx = jnp.minimum(q_idx, extent[0] - 1), jnp.minimum(k_idx, extent[1] - 1)
    return (
        jnp.arange(batch, dtype=jnp.int32)[:, None, None, None],
        jnp.arange(heads, dtype=jnp.int32)[None, :, None, None],
        (q_idx + jnp.asarray(offset, jnp.int32))[None, None, :, None],
        k_idx[None, None, None, :],
    )
