"""attnjax: attention mechanisms as pure JAX functions, Flax NNX modules and tiled kernels."""

from attnjax import masks, mods, scores
from attnjax.attention import attention, choose_implementation
from attnjax.softmax import masked_softmax, masked_softmax_with_lse
from attnjax.tiling import BlockSizes

__all__ = [
    "BlockSizes",
    "attention",
    "choose_implementation",
    "masked_softmax",
    "masked_softmax_with_lse",
    "masks",
    "mods",
    "scores",
]
__version__ = "0.1.0"
