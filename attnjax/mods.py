"""A gallery of score and mask modifiers for ``attention(..., score_mod=, mask_mod=)``.

Each function returns a mod. Score mods map ``(logits, b, h, q_idx, kv_idx, params)`` to
logits; mask mods map ``(b, h, q_idx, kv_idx, params)`` to booleans (True = may attend).
Indices are absolute (``q_idx`` is the query's position in key coordinates), so a mod holds
for any tiling and in one-token decoding. Learnable or per-batch values are read from
``mod_params[name]`` (``params`` is the dict passed as ``mod_params``), never closed over:
gradients reach them through every implementation. Compose with :func:`and_masks`,
:func:`or_masks` and :func:`compose`. See ``docs/mods.md``.
"""

import functools
import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

ScoreMod = Callable[..., Float[Array, "B N Tb Sb"]]
MaskMod = Callable[..., Array]


def alibi_slopes(num_heads: int) -> Float[np.ndarray, " N"]:
    """ALiBi's slopes: a geometric sequence from ``2^(-8/N)`` (Press et al., 2022).

    For a head count that is not a power of two, the slopes of the next lower power of two
    followed by every other slope of the next higher one, as in the paper's code.
    """
    return _alibi_slope(np.arange(num_heads), num_heads, np).astype(np.float32)


def _alibi_slope(h: Int[ArrayLike, "..."], num_heads: int, xp=jnp) -> Float[ArrayLike, "..."]:
    """Head ``h``'s slope as arithmetic on ``h`` (kernels cannot index constant tables);
    ``xp`` is ``jnp`` or ``np``."""
    low = 2 ** math.floor(math.log2(num_heads))
    exponent = xp.where(h < low, -8.0 * (h + 1) / low, -4.0 * (2 * (h - low) + 1) / low)
    return xp.exp(exponent * math.log(2.0))


def alibi(num_heads: int | None = None, *, param: str | None = None) -> ScoreMod:
    """``logits - slope[h] · |q_idx - kv_idx|``: ALiBi's linear distance penalty.

    Slopes are the paper's (:func:`alibi_slopes`, constants for ``num_heads`` heads), or
    learnable: ``mod_params[param]`` of shape ``[N]``.
    """
    if (num_heads is None) == (param is None):
        raise ValueError("alibi: pass num_heads (standard slopes) or param (learnable), not both")

    def score_mod(logits, b, h, q_idx, kv_idx, params):
        slope = _alibi_slope(h, num_heads) if param is None else params[param][h]
        return logits - slope * jnp.abs(q_idx - kv_idx).astype(jnp.float32)

    return score_mod


def softcap(cap: float) -> ScoreMod:
    """``cap · tanh(logits / cap)``: logits squashed into ``(-cap, cap)`` (Gemma 2)."""
    if not cap > 0:
        raise ValueError(f"softcap: expected cap > 0, got {cap!r}")

    def score_mod(logits, b, h, q_idx, kv_idx, params):
        return cap * jnp.tanh(logits / cap)

    return score_mod


def relative_position_bucket(
    relative: Int[Array, "..."], num_buckets: int, max_distance: int, bidirectional: bool
) -> Int[Array, "..."]:
    """T5's bucket of ``relative = kv_idx - q_idx``: exact for small distances, logarithmic
    up to ``max_distance``, one bucket beyond. Bidirectional: half the buckets per side;
    else keys after the query share bucket 0."""
    bucket = jnp.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = jnp.where(relative > 0, num_buckets, 0)
        distance = jnp.abs(relative)
    else:
        distance = jnp.maximum(-relative, 0)
    exact = num_buckets // 2
    scaled = jnp.log(jnp.maximum(distance, 1) / exact) / math.log(max_distance / exact)
    log_bucket = exact + (scaled * (num_buckets - exact)).astype(relative.dtype)
    log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
    return bucket + jnp.where(distance < exact, distance, log_bucket)


def relative_position_bias(
    num_buckets: int = 32,
    max_distance: int = 128,
    *,
    bidirectional: bool = True,
    param: str = "relative_bias",
) -> ScoreMod:
    """``logits + table[h, bucket(kv_idx - q_idx)]`` with the learnable ``mod_params[param]``
    of shape ``[N, num_buckets]`` (T5, Raffel et al., 2020)."""
    bucket = functools.partial(
        relative_position_bucket,
        num_buckets=num_buckets,
        max_distance=max_distance,
        bidirectional=bidirectional,
    )

    def score_mod(logits, b, h, q_idx, kv_idx, params):
        return logits + params[param][h, bucket(kv_idx - q_idx)]

    return score_mod


def compose(*score_mods: ScoreMod) -> ScoreMod:
    """The score mods applied in order, each to the previous one's logits."""

    def score_mod(logits, b, h, q_idx, kv_idx, params):
        for mod in score_mods:
            logits = mod(logits, b, h, q_idx, kv_idx, params)
        return logits

    return score_mod


def causal() -> MaskMod:
    """``kv_idx <= q_idx`` (with ``causal_offset``, as ``is_causal``)."""

    def mask_mod(b, h, q_idx, kv_idx, params):
        return kv_idx <= q_idx

    return mask_mod


def sliding_window(left: int, right: int = 0) -> MaskMod:
    """``q_idx - left <= kv_idx <= q_idx + right`` (``right=0``: causal sliding window)."""
    if not all(isinstance(w, int) and w >= 0 for w in (left, right)):
        raise ValueError(f"sliding_window: expected ints >= 0, got left={left!r}, right={right!r}")

    def mask_mod(b, h, q_idx, kv_idx, params):
        return (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)

    return mask_mod


def dilated(stride: int) -> MaskMod:
    """Keys a multiple of ``stride`` from the query: ``(q_idx - kv_idx) % stride == 0``."""
    if not (isinstance(stride, int) and stride >= 1):
        raise ValueError(f"dilated: expected an int stride >= 1, got {stride!r}")

    def mask_mod(b, h, q_idx, kv_idx, params):
        return (q_idx - kv_idx) % stride == 0

    return mask_mod


def prefix_lm(param: str = "prefix_lengths") -> MaskMod:
    """Causal, except that the first ``mod_params[param][b]`` keys (the prefix, ``[B]``) are
    visible to every query (Raffel et al., 2020)."""

    def mask_mod(b, h, q_idx, kv_idx, params):
        return (kv_idx <= q_idx) | (kv_idx < params[param][b])

    return mask_mod


def document(param: str = "document_ids") -> MaskMod:
    """Packed sequences: query and key in the same document, ``mod_params[param]`` of shape
    ``[B, S]`` giving each key position's document (queries are looked up at ``q_idx``)."""

    def mask_mod(b, h, q_idx, kv_idx, params):
        ids = params[param]
        return _at(ids, b, q_idx) == _at(ids, b, kv_idx)

    return mask_mod


def _at(ids: Any, b: Array, idx: Array) -> Array:
    """``ids[b, idx]`` with positions past the end clamped (tiles pad them); ``ids`` may be
    an array or, inside a Pallas kernel, a ref."""
    return ids[b, jnp.clip(idx, 0, ids.shape[1] - 1)]


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """A key is visible when every mask mod allows it."""
    return _reduce(jnp.logical_and, mask_mods)


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """A key is visible when any mask mod allows it."""
    return _reduce(jnp.logical_or, mask_mods)


def _reduce(op, mask_mods):
    if not mask_mods:
        raise ValueError("expected at least one mask mod")

    def mask_mod(b, h, q_idx, kv_idx, params):
        return functools.reduce(op, (m(b, h, q_idx, kv_idx, params) for m in mask_mods))

    return mask_mod
