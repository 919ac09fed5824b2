"""attnjax: attention mechanisms as pure JAX functions, Flax NNX modules and tiled kernels."""

from attnjax import masks, scores
from attnjax.attention import attention
from attnjax.softmax import masked_softmax, masked_softmax_with_lse

__all__ = ["attention", "masked_softmax", "masked_softmax_with_lse", "masks", "scores"]
__version__ = "0.1.0"
