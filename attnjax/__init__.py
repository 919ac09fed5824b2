"""attnjax: attention mechanisms as pure JAX functions, Flax NNX modules and tiled kernels."""

from attnjax import masks, scores
from attnjax.attention import attention
from attnjax.softmax import masked_softmax, masked_softmax_with_lse
from attnjax.tiling import BlockSizes

__all__ = [
    "BlockSizes",
    "attention",
    "masked_softmax",
    "masked_softmax_with_lse",
    "masks",
    "scores",
]
__version__ = "0.1.0"
