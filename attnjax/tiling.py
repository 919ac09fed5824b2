"""Helpers shared by the tiled implementations: block sizes, padding, slicing per tile.

Block-broadcast arrays (``bias``, ``temperature``, a dense ``mask``) are 4-D and broadcastable
to ``[B, N, T, S]``: a query or key axis of size 1 is shared by every tile, any other is
sliced per tile.
"""

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Int

if TYPE_CHECKING:
    from attnjax.masks import MaskSpec


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: ``block_q`` queries by ``block_k`` keys (clamped to the sequence lengths)."""

    block_q: int
    block_k: int

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"block_sizes.{name}: expected an int >= 1, got {value!r}")

    def clamp(self, num_queries: int, num_keys: int) -> "BlockSizes":
        """Blocks no larger than the sequences they tile."""
        return BlockSizes(min(self.block_q, num_queries), min(self.block_k, num_keys))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_axis(x: Array, axis: int, size: int, value: int | float | bool = 0) -> Array:
    """Pad ``x`` along ``axis`` at the end up to ``size`` (no-op when already that long)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def as_4d(x: ArrayLike | None) -> Array | None:
    """Prefix size-1 axes up to rank 4 (``x`` already broadcasts to ``[B, N, T, S]``)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def pad_tiles(x: Array | None, num_queries: int, num_keys: int, value=0) -> Array | None:
    """Pad the non-broadcast query/key axes of a 4-D block-broadcast array."""
    if x is None:
        return None
    if x.shape[2] != 1:
        x = pad_axis(x, 2, num_queries, value)
    if x.shape[3] != 1:
        x = pad_axis(x, 3, num_keys, value)
    return x


def _starts(x: Array, q_start: Int[ArrayLike, ""], k_start: Int[ArrayLike, ""]) -> tuple:
    """int32 starts (``dynamic_slice`` wants one index type, also under ``jax_enable_x64``)."""
    starts = (0, 0, q_start if x.shape[2] != 1 else 0, k_start if x.shape[3] != 1 else 0)
    return tuple(jnp.asarray(s, jnp.int32) for s in starts)


def _sizes(x: Array, block_q: int, block_k: int) -> tuple[int, ...]:
    return (*x.shape[:2], min(x.shape[2], block_q), min(x.shape[3], block_k))


def tile(x: Array | None, q_start, k_start, block_q: int, block_k: int) -> Array | None:
    """The tile of a block-broadcast array at ``(q_start, k_start)``."""
    if x is None:
        return None
    return jax.lax.dynamic_slice(x, _starts(x, q_start, k_start), _sizes(x, block_q, block_k))


def tile_add(x: Array | None, q_start, k_start, update: Array | None) -> Array | None:
    """``x`` with ``update`` (a tile as given by :func:`tile`) added at ``(q_start, k_start)``."""
    if x is None:
        return None
    starts = _starts(x, q_start, k_start)
    old = jax.lax.dynamic_slice(x, starts, update.shape)
    return jax.lax.dynamic_update_slice(x, old + update, starts)


def _block_range(first, last, block: int, num_blocks: int):
    lo = 0 if first is None else jnp.clip(jnp.floor_divide(first, block), 0, num_blocks)
    hi = num_blocks if last is None else jnp.clip(jnp.floor_divide(last, block) + 1, 0, num_blocks)
    return lo, hi


def key_block_range(spec: "MaskSpec", q_start, block_q: int, block_k: int, num_k_blocks: int):
    """``[lo, hi)``: the key blocks that queries ``q_start ... q_start + block_q - 1`` may see.

    Blocks outside it are fully masked by the causal/window rules and can be skipped.
    """
    low, high = spec.diff_bounds()
    first = None if low is None else q_start + spec.offset + low
    last = None if high is None else q_start + block_q - 1 + spec.offset + high
    return _block_range(first, last, block_k, num_k_blocks)


def query_block_range(spec: "MaskSpec", k_start, block_q: int, block_k: int, num_q_blocks: int):
    """``[lo, hi)``: the query blocks that may see keys ``k_start ... k_start + block_k - 1``."""
    low, high = spec.diff_bounds()
    first = None if high is None else k_start - spec.offset - high
    last = None if low is None else k_start + block_k - 1 - spec.offset - low
    return _block_range(first, last, block_q, num_q_blocks)


def full_key_block_range(spec: "MaskSpec", q_start, block_q: int, block_k: int, lo, hi):
    """``[full_lo, full_hi)`` within ``[lo, hi)``: the key blocks each query sees whole.

    Whole under the causal/window rules for every query ``q_start ... q_start + block_q - 1``:
    such tiles need no mask.
    """
    low, high = spec.diff_bounds()
    first = None if low is None else q_start + block_q - 1 + spec.offset + low
    last = None if high is None else q_start + spec.offset + high
    return _full_range(first, last, block_k, lo, hi)


def full_query_block_range(spec: "MaskSpec", k_start, block_q: int, block_k: int, lo, hi):
    """``[full_lo, full_hi)`` within ``[lo, hi)``: the query blocks that see the key block whole.

    Every query of such a block sees keys ``k_start ... k_start + block_k - 1`` under the
    causal/window rules.
    """
    low, high = spec.diff_bounds()
    first = None if high is None else k_start + block_k - 1 - spec.offset - high
    last = None if low is None else k_start - spec.offset - low
    return _full_range(first, last, block_q, lo, hi)


def _full_range(first, last, block: int, lo, hi):
    """The blocks within ``[lo, hi)`` whose indices all lie in ``[first, last]``."""
    full_lo = lo if first is None else jnp.maximum(lo, (jnp.maximum(first, 0) + block - 1) // block)
    full_hi = hi if last is None else jnp.minimum(hi, jnp.maximum(last + 1, 0) // block)
    full_lo = jnp.minimum(full_lo, hi)
    return full_lo, jnp.maximum(full_hi, full_lo)


def split_loop(lo, full_lo, full_hi, hi, body, carry):
    """``fori_loop`` over ``[lo, hi)``: ``body(False)`` (no mask) on ``[full_lo, full_hi)``.

    ``body(True)`` (masked) runs on the edge blocks before and after.
    """
    carry = jax.lax.fori_loop(lo, full_lo, body(True), carry)
    carry = jax.lax.fori_loop(full_lo, full_hi, body(False), carry)
    return jax.lax.fori_loop(full_hi, hi, body(True), carry)
