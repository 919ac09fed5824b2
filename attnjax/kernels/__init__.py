"""Pallas kernels: flash attention for dot-product scores and a tiled additive kernel."""

from attnjax.kernels.attention import SUPPORTED_SCORES, pallas_attention, unsupported

__all__ = ["SUPPORTED_SCORES", "pallas_attention", "unsupported"]
