"""Block sparsity: which tiles of a mask are empty, partial or full, so tiled paths skip work.

A :class:`BlockMask` holds one kind per (batch, head, query tile, key tile): EMPTY tiles are
never visited, FULL tiles run without evaluating any mask, PARTIAL tiles evaluate the mask
element by element. Built once from a ``mask_mod`` (:func:`block_mask`) and reused across
layers and calls through ``attention(..., block_mask=...)``.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Int

from attnjax.masks.checks import check_closure, check_signature, run_mod
from attnjax.masks.rules import EMPTY, FULL, PARTIAL, TileKinds, mod_indices
from attnjax.tiling import BlockSizes

MaskMod = Callable[..., Any]
# FlexAttention's default tile; attention() tiles with the BlockMask's sizes.
DEFAULT_BLOCKS = BlockSizes(128, 128)
# Mask entries evaluated at once while classifying (tiles are mapped in batches of this size).
_CLASSIFY_ENTRIES = 1 << 22


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["kinds", "offset", "mod_params"],
    meta_fields=["block_sizes", "num_queries", "num_keys", "mask_mod"],
)
@dataclasses.dataclass(frozen=True)
class BlockMask:
    """Tile kinds ``[#B, #N, Tq, Sk]`` (EMPTY/PARTIAL/FULL) of ``mask_mod`` for ``T x S``
    tiled by ``block_sizes``, with queries at positions ``t + offset`` (a pytree). It carries
    the ``mod_params`` it was built from: ``attention`` evaluates ``mask_mod`` on them, so
    the tiles and the elements never disagree."""

    # A pytree: JAX rebuilds it with placeholder leaves, so runtime type checkers skip __init__.
    __no_type_check__ = True

    kinds: TileKinds
    block_sizes: BlockSizes
    num_queries: int
    num_keys: int
    mask_mod: MaskMod | None = None
    offset: Int[ArrayLike, ""] = 0
    mod_params: Any = None

    def density(self) -> float:
        """The fraction of tiles that are visited (not empty)."""
        return float(np.mean(np.asarray(self.kinds) != EMPTY))

    def __repr__(self) -> str:
        shape = f"{tuple(self.kinds.shape[:2])} x {self.num_queries} x {self.num_keys}"
        tiles = f"{self.block_sizes.block_q}x{self.block_sizes.block_k} tiles"
        if isinstance(self.kinds, jax.core.Tracer):
            return f"BlockMask({shape}, {tiles})"
        kinds = np.asarray(self.kinds)
        full, partial = np.mean(kinds == FULL), np.mean(kinds == PARTIAL)
        return (
            f"BlockMask({shape}, {tiles} {kinds.shape[2]}x{kinds.shape[3]}, "
            f"density {full + partial:.1%}: full {full:.1%}, partial {partial:.1%})"
        )

    def plot(self, batch: int = 0, head: int = 0, ax=None):
        """Draw the tile kinds of one (batch, head) with matplotlib; returns the axes."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap

        if ax is None:
            _, ax = plt.subplots(figsize=(4, 4))
        kinds = np.asarray(self.kinds)
        kinds = kinds[min(batch, kinds.shape[0] - 1), min(head, kinds.shape[1] - 1)]
        colors = ListedColormap(["white", "#9ecae1", "#08519c"])
        ax.imshow(kinds, cmap=colors, vmin=EMPTY, vmax=FULL, interpolation="nearest")
        ax.set_xlabel(f"key tile ({self.block_sizes.block_k} keys)")
        ax.set_ylabel(f"query tile ({self.block_sizes.block_q} queries)")
        ax.set_title(f"density {np.mean(kinds != EMPTY):.1%} (dark: full, light: partial)")
        return ax


def block_mask(
    mask_mod: MaskMod,
    mod_params: Any = None,
    batch: int | None = None,
    heads: int | None = None,
    num_queries: int = 1,
    num_keys: int = 1,
    block_sizes: BlockSizes | None = None,
    *,
    causal_offset: Int[ArrayLike, ""] = 0,
) -> BlockMask:
    """Classify every tile of ``mask_mod(b, h, q_idx, kv_idx, mod_params)``.

    ``batch``/``heads`` ``None``: the mask does not depend on ``b``/``h`` (one kind shared by
    all). Tiles are evaluated in batches, so memory stays O(T·S / tile²) beyond one batch of
    tiles; jit-able, and ``mod_params`` may hold per-batch data (document ids, prefix lengths).
    ``block_sizes`` defaults to 128 x 128 (clamped to the lengths).
    """
    if not callable(mask_mod):
        raise TypeError(
            f"mask_mod: expected a callable (b, h, q_idx, kv_idx, params), got {mask_mod!r}"
        )
    check_signature("mask_mod", mask_mod)
    check_closure("mask_mod", mask_mod)
    mod_params = jax.tree.map(jnp.asarray, mod_params)
    for name, size in (("num_queries", num_queries), ("num_keys", num_keys)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {size!r}")
    blocks = (block_sizes or DEFAULT_BLOCKS).clamp(num_queries, num_keys)
    bq, bk = blocks.block_q, blocks.block_k
    nq, nk = -(-num_queries // bq), -(-num_keys // bk)
    b, h = batch or 1, heads or 1

    def classify(tile: Int[ArrayLike, ""]) -> Int[ArrayLike, "B N"]:
        q_idx, k_idx = (tile // nk) * bq + jnp.arange(bq), (tile % nk) * bk + jnp.arange(bk)
        idx = mod_indices(b, h, q_idx, k_idx, causal_offset, (num_queries, num_keys))
        allowed = jnp.asarray(run_mod("mask_mod", mask_mod, idx, mod_params))
        if allowed.dtype != bool:
            raise TypeError(
                f"mask_mod: must return booleans (True = may attend), got {allowed.dtype}"
            )
        allowed = jnp.broadcast_to(allowed, (b, h, bq, bk))
        valid = ((q_idx < num_queries)[:, None] & (k_idx < num_keys)[None, :])[None, None]
        every = jnp.all(allowed | ~valid, axis=(2, 3))
        some = jnp.any(allowed & valid, axis=(2, 3))
        return jnp.where(every, FULL, jnp.where(some, PARTIAL, EMPTY)).astype(jnp.int8)

    per_batch = max(1, _CLASSIFY_ENTRIES // (b * h * bq * bk))
    kinds = jax.lax.map(classify, jnp.arange(nq * nk), batch_size=min(per_batch, nq * nk))
    kinds = jnp.transpose(kinds.reshape(nq, nk, b, h), (2, 3, 0, 1))
    return BlockMask(kinds, blocks, num_queries, num_keys, mask_mod, causal_offset, mod_params)
