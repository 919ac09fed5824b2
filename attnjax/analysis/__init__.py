"""Diagnostics of attention maps and regularizers built on them."""

from attnjax.analysis.diagnostics import (
    effective_rank,
    entropy,
    gradient_norm_by_position,
    head_similarity,
    max_logit,
    saturation,
    softmax_jacobian_norm,
)
from attnjax.analysis.regularizers import (
    cosine_diversity_penalty,
    orthogonality_penalty,
    z_loss,
)

__all__ = [
    "cosine_diversity_penalty",
    "effective_rank",
    "entropy",
    "gradient_norm_by_position",
    "head_similarity",
    "max_logit",
    "orthogonality_penalty",
    "saturation",
    "softmax_jacobian_norm",
    "z_loss",
]
