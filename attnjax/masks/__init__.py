"""Boolean attention masks (True = may attend): structured rules of (query index, key index),
:class:`MaskSpec` for one call's rules, and :class:`BlockMask`, which tiles know to skip."""

from attnjax.masks.blocks import BlockMask, block_mask
from attnjax.masks.rules import (
    EMPTY,
    FULL,
    PARTIAL,
    MaskSpec,
    TileKinds,
    TileMask,
    causal,
    combine,
    lengths,
    local_window,
    mod_indices,
    segments,
)

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "BlockMask",
    "MaskSpec",
    "TileKinds",
    "TileMask",
    "block_mask",
    "causal",
    "combine",
    "lengths",
    "local_window",
    "mod_indices",
    "segments",
]
