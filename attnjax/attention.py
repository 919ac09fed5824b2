"""``attention``: the public entry. Validates, normalizes arguments, dispatches."""

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from attnjax.chunked import chunked_attention
from attnjax.dense import dense_attention
from attnjax.kernels import pallas_attention, unsupported
from attnjax.masks import MaskSpec
from attnjax.scores import SCORES
from attnjax.tiling import BlockSizes

IMPLEMENTATIONS = {
    "xla": dense_attention,
    "chunked": chunked_attention,
    "pallas": pallas_attention,
}
TILED = ("chunked", "pallas")
# implementation=None on CPU: dense below this many logits per (batch, head), chunked from it
# on. Measured with benchmarks/attention.py (docs/performance.md).
CHUNKED_MIN_LOGITS = 512 * 512


def attention(
    query: Float[ArrayLike, "*B T N H"],
    key: Float[ArrayLike, "*B S K H"],
    value: Float[ArrayLike, "*B S K Hv"],
    bias: Float[ArrayLike, "..."] | None = None,
    mask: Bool[ArrayLike, "..."] | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    causal_offset: Int[ArrayLike, ""] = 0,
    query_seq_lengths: Int[ArrayLike, " B"] | None = None,
    key_value_seq_lengths: Int[ArrayLike, " B"] | None = None,
    q_segment_ids: Int[ArrayLike, "*B T"] | None = None,
    kv_segment_ids: Int[ArrayLike, "*B S"] | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    score: str | Callable[[Array, Array, Any], Array] = "scaled_dot",
    score_params: Any = None,
    temperature: Float[ArrayLike, "..."] | float | None = None,
    return_weights: bool = False,
    return_residual: bool = False,
    implementation: str | None = None,
    block_sizes: BlockSizes | None = None,
):
    """Attention with any scoring function; a drop-in for ``jax.nn.dot_product_attention``.

    Shapes: ``query [B, T, N, H]``, ``key [B, S, K, H]``, ``value [B, S, K, Hv]`` with
    ``N % K == 0`` (``K < N``: grouped/multi-query attention), or the same without ``B``.
    ``bias`` (float) and ``mask`` (bool, True = may attend) broadcast to ``[B, N, T, S]``.

    Logits are ``(score(q, k, score_params) + bias) / temperature``, then masked, then a
    float32 softmax. ``score`` is ``"dot"``, ``"scaled_dot"`` (``scale`` defaults to
    ``1/sqrt(H)``), ``"bilinear"`` (``{"w"}``), ``"additive"`` / ``"additive_relu"``
    (``{"w_q", "w_k", "v", "b"?}``), ``"cosine"`` (``{"scale"?}``), or a callable
    ``(q [B, N, T, H], k [B, N, S, H], score_params) -> logits [B, N, T, S]`` (not rescaled).
    Parameters may carry a leading head dimension ``[N, ...]``.

    Structured masks: ``is_causal`` (key ``s`` visible from query ``t`` iff
    ``s <= t + causal_offset``), sequence lengths, segment ids, ``local_window_size``
    (``(left, right)`` around ``t + causal_offset``). A query row with no visible key gives
    output 0, weights 0 and zero gradients (``jax.nn`` gives the mean of ``value`` instead).

    Returns ``output [B, T, N, Hv]`` in the query's dtype; with ``return_weights`` also
    ``weights [B, N, T, S]`` (float32); with ``return_residual`` also the log-sum-exp
    ``[B, N, T]`` (float32, ``-inf`` for rows with no visible key).

    ``implementation``: ``"xla"`` (dense: materializes the logits), ``"chunked"`` (online
    softmax over tiles in XLA, O(T) memory forward and backward), ``"pallas"`` (Pallas
    kernels for the named dot-product and additive scores, structured masks only) or ``None``
    to choose: dense for short sequences or when ``return_weights`` is set, else pallas on
    GPU where it applies, else chunked. Tiled implementations never form the weights, so
    ``return_weights=True`` with them is an error. ``block_sizes`` (:class:`attnjax.BlockSizes`)
    sets their tiles; each has defaults. See ``docs/tiled.md``.
    """
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    batched = query.ndim == 4
    _check_qkv(query, key, value)
    if not batched:
        query, key, value = query[None], key[None], value[None]
        query_seq_lengths, key_value_seq_lengths = (
            None if x is None else jnp.reshape(x, (1,))
            for x in (query_seq_lengths, key_value_seq_lengths)
        )
        q_segment_ids, kv_segment_ids = (
            None if x is None else jnp.asarray(x)[None] for x in (q_segment_ids, kv_segment_ids)
        )
    batch, num_queries, num_heads, head_dim = query.shape
    num_keys = key.shape[1]
    logits_shape = (batch, num_heads, num_queries, num_keys)

    bias = _check_broadcast("bias", bias, logits_shape, batched)
    if mask is not None and jnp.asarray(mask).dtype != bool:
        raise TypeError(
            f"mask: expected a boolean array (True = may attend), got dtype "
            f"{jnp.asarray(mask).dtype}; pass additive masks as `bias`"
        )
    mask = _check_broadcast("mask", mask, logits_shape, batched)
    temperature = _check_broadcast(
        "temperature", _check_temperature(temperature), logits_shape, batched
    )
    mask_spec = MaskSpec(
        is_causal=bool(is_causal),
        window=_check_window(local_window_size),
        offset=causal_offset,
        q_lengths=_check_lengths("query_seq_lengths", query_seq_lengths, batch),
        kv_lengths=_check_lengths("key_value_seq_lengths", key_value_seq_lengths, batch),
        **_check_segments(q_segment_ids, kv_segment_ids, batch, num_queries, num_keys),
    )
    score_name = score if isinstance(score, str) else None
    score_fn, score_params = _resolve_score(score, score_params, scale, num_heads, head_dim)
    if implementation is None:
        implementation = _choose_implementation(
            return_weights, num_queries * num_keys, unsupported(score_name, bias, mask, temperature)
        )
    _check_implementation(implementation, return_weights, block_sizes)
    tiled = {"block_sizes": block_sizes} if implementation in TILED else {}
    output, weights, lse = IMPLEMENTATIONS[implementation](
        query,
        key,
        value,
        score=score_fn,
        score_params=score_params,
        score_name=score_name,
        bias=bias,
        mask=mask,
        mask_spec=mask_spec,
        temperature=temperature,
        **tiled,
    )
    if not batched:
        output, lse = output[0], lse[0]
        weights = None if weights is None else weights[0]
    extras = (weights,) * return_weights + (lse,) * return_residual
    return (output, *extras) if extras else output


def _choose_implementation(return_weights: bool, num_logits: int, pallas_refuses) -> str:
    """Dense for short sequences or weights; else pallas on GPU where it applies, or chunked."""
    if return_weights or num_logits < CHUNKED_MIN_LOGITS:
        return "xla"
    if jax.default_backend() == "gpu" and pallas_refuses is None:
        return "pallas"
    return "chunked"


def _check_implementation(
    implementation: str, return_weights: bool, block_sizes: BlockSizes | None
) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation: expected one of {sorted(IMPLEMENTATIONS)} or None, "
            f"got {implementation!r}"
        )
    if return_weights and implementation in TILED:
        raise ValueError(
            f"return_weights: implementation={implementation!r} never forms the [B, N, T, S] "
            "weights; use implementation='xla' (or None) to get them"
        )
    if block_sizes is not None and not isinstance(block_sizes, BlockSizes):
        raise TypeError(f"block_sizes: expected attnjax.BlockSizes or None, got {block_sizes!r}")


def _check_qkv(query: Array, key: Array, value: Array) -> None:
    shapes = f"query {query.shape}, key {key.shape}, value {value.shape}"
    if query.ndim not in (3, 4) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(
            f"query, key, value: expected ranks 4 ([B, T, N, H], [B, S, K, H], [B, S, K, Hv]) "
            f"or 3 (unbatched), all equal; got {shapes}"
        )
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key, value: batch, length and head dims must match; got {shapes}")
    if query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"query, key: batch dims must match; got {shapes}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query, key: head size H must match; got {shapes}")
    num_heads, num_kv_heads = query.shape[-2], key.shape[-2]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads N={num_heads} must be a multiple of key/value heads K={num_kv_heads}; "
            f"got {shapes}"
        )


def _check_broadcast(
    name: str, x: ArrayLike | None, logits_shape: tuple[int, ...], batched: bool
) -> Array | None:
    """``x`` must broadcast to ``[B, N, T, S]`` (``[N, T, S]`` for unbatched inputs)."""
    if x is None:
        return None
    x = jnp.asarray(x)
    target = logits_shape if batched else logits_shape[1:]
    try:
        ok = x.ndim <= len(target) and np.broadcast_shapes(x.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {x.shape} does not broadcast to {target} ([B, N, T, S])")
    return x if batched else x[None]


def _check_temperature(temperature: ArrayLike | None) -> Array | None:
    if temperature is None:
        return None
    if not isinstance(temperature, jax.core.Tracer) and not np.all(np.asarray(temperature) > 0):
        raise ValueError(f"temperature: expected values > 0, got {temperature!r}")
    return jnp.asarray(temperature, jnp.float32)


def _check_window(window: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if window is None:
        return None
    pair = (window, window) if isinstance(window, int) else tuple(window)
    if len(pair) != 2 or not all(isinstance(w, int) and w >= 0 for w in pair):
        raise ValueError(
            f"local_window_size: expected an int >= 0 or a pair (left, right) of them, "
            f"got {window!r}"
        )
    return pair


def _check_lengths(name: str, lengths: ArrayLike | None, batch: int) -> Array | None:
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"{name}: expected an integer array of shape ({batch},), "
            f"got {lengths.dtype} {lengths.shape}"
        )
    return lengths


def _check_segments(
    q_ids: ArrayLike | None, kv_ids: ArrayLike | None, batch: int, num_q: int, num_kv: int
) -> dict[str, Array | None]:
    if q_ids is None and kv_ids is None:
        return {}
    if q_ids is None or kv_ids is None:
        raise ValueError("q_segment_ids, kv_segment_ids: pass both or neither")
    q_ids, kv_ids = jnp.asarray(q_ids), jnp.asarray(kv_ids)
    if q_ids.shape != (batch, num_q) or kv_ids.shape != (batch, num_kv):
        raise ValueError(
            f"q_segment_ids, kv_segment_ids: expected shapes ({batch}, {num_q}) and "
            f"({batch}, {num_kv}), got {q_ids.shape} and {kv_ids.shape}"
        )
    return {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids}


def _resolve_score(
    score: str | Callable, params: Any, scale: float | None, num_heads: int, head_dim: int
) -> tuple[Callable, Any]:
    """A callable ``(q, k, params) -> logits`` and its validated parameters."""
    if scale is not None and score != "scaled_dot":
        raise ValueError(
            f"scale: applies to score='scaled_dot' only, got score={score!r} "
            "(cosine takes score_params={'scale': ...}; callables scale themselves)"
        )
    if callable(score):
        return score, params
    if score not in SCORES:
        raise ValueError(f"score: expected one of {sorted(SCORES)} or a callable, got {score!r}")
    spec = SCORES[score]
    params = dict(params or {})
    if score == "scaled_dot":
        if scale is not None and "scale" in params:
            raise ValueError("scale: given both as `scale` and in score_params; pass one")
        params.setdefault("scale", 1.0 / math.sqrt(head_dim) if scale is None else scale)
    unknown = sorted(set(params) - set(spec.params))
    missing = sorted(set(spec.required) - set(params))
    if unknown or missing:
        raise ValueError(
            f"score_params for score={score!r}: expected keys {sorted(spec.params)} "
            f"(required {sorted(spec.required)}); unknown {unknown}, missing {missing}"
        )
    sizes = {"H": head_dim}
    for name, value in params.items():
        _check_param(score, name, jnp.shape(value), spec.params[name], sizes, num_heads)

    def score_fn(q: Array, k: Array, p: dict[str, Array]) -> Array:
        return spec.fn(q, k, **p)

    return score_fn, params


def _check_param(
    score: str,
    name: str,
    shape: tuple[int, ...],
    trailing: tuple[str, ...],
    sizes: dict[str, int],
    num_heads: int,
) -> None:
    """Trailing dims as declared (``"A"`` shared by all parameters); leading dims () or (N,)."""
    n = len(trailing)
    lead, tail = shape[: len(shape) - n], shape[len(shape) - n :]
    ok = (
        len(shape) >= n
        and lead in ((), (1,), (num_heads,))
        and all(sizes.setdefault(s, d) == d for d, s in zip(tail, trailing, strict=True))
    )
    if not ok:
        expected = ", ".join(f"{s}={sizes[s]}" if s in sizes else s for s in trailing)
        raise ValueError(
            f"score_params[{name!r}] for score={score!r}: expected shape [{expected}] with an "
            f"optional leading head dim N={num_heads}, got {shape}"
        )
