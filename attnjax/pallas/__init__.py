"""Pallas kernels: flash attention for dot-product scores and a tiled additive kernel (Triton),
and a Mosaic TPU flash kernel (:mod:`attnjax.pallas.tpu`)."""

from attnjax.pallas.attention import TILE_SCORES, pallas_attention, unsupported

__all__ = ["TILE_SCORES", "pallas_attention", "unsupported"]
