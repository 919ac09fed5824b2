"""Diagnostics of attention maps and regularizers built on them."""

from attnjax.analysis.diagnostics import (
    cosine_weight_bound,
    effective_rank,
    entropy,
    gradient_norm_by_position,
    head_similarity,
    max_logit,
    max_logit_from_softmax,
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
    "cosine_weight_bound",
    "effective_rank",
    "entropy",
    "gradient_norm_by_position",
    "head_similarity",
    "max_logit",
    "max_logit_from_softmax",
    "orthogonality_penalty",
    "saturation",
    "softmax_jacobian_norm",
    "z_loss",
]
