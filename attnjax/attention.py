"""``attention``: the public entry. Validates (:mod:`attnjax.call`), then dispatches."""

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from attnjax.call import AttentionCall, MaskMod, ScoreMod, prepare
from attnjax.chunked import chunked_attention
from attnjax.dense import dense_attention
from attnjax.masks import BlockMask
from attnjax.pallas import pallas_attention, triton_backend, unsupported
from attnjax.pallas.platform import platform_attention
from attnjax.pallas.tpu import refuses as tpu_refuses
from attnjax.pallas.tpu import tpu_attention
from attnjax.tiling import BlockSizes

IMPLEMENTATIONS = {
    "xla": dense_attention,
    "chunked": chunked_attention,
    "pallas": platform_attention,
    "pallas_triton": pallas_attention,
    "pallas_tpu": tpu_attention,
    "cudnn": None,  # jax.nn.dot_product_attention(implementation="cudnn"), see _cudnn
}
TILED = ("chunked", "pallas", "pallas_triton", "pallas_tpu")
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
    return_lse: bool = False,
    implementation: str | None = None,
    block_sizes: BlockSizes | None = None,
    score_mod: ScoreMod | None = None,
    mask_mod: MaskMod | None = None,
    mod_params: Any = None,
    block_mask: BlockMask | None = None,
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

    Modifiers (FlexAttention's, see ``docs/mods.md`` and :mod:`attnjax.mods`):
    ``score_mod(logits, b, h, q_idx, kv_idx, mod_params) -> logits`` is applied elementwise
    after the temperature; ``mask_mod(b, h, q_idx, kv_idx, mod_params) -> bool`` joins the
    masks. ``b``, ``h`` (query head), ``q_idx`` (``t + causal_offset``) and ``kv_idx`` (``s``)
    are int32 absolute positions broadcastable to the logits, whatever the tiling.
    ``mod_params`` is a pytree for both mods; its float leaves get gradients.
    ``block_mask`` (:func:`attnjax.masks.block_mask`) tells tiled paths which tiles of
    ``mask_mod`` are empty (skipped) or full (no mask evaluated); they tile with its sizes.

    Structured masks: ``is_causal`` (key ``s`` visible from query ``t`` iff
    ``s <= t + causal_offset``), sequence lengths, segment ids, ``local_window_size``
    (``(left, right)`` around ``t + causal_offset``). A query row with no visible key gives
    output 0, weights 0 and zero gradients (``jax.nn`` gives the mean of ``value`` instead).
    Non-finite values behave as in ``jax.nn`` on every implementation: a NaN or ``+inf``
    among a row's visible logits makes the row NaN; ``-inf`` logits are masked keys, so a
    row whose visible logits are all ``-inf`` is a row with no visible key (``jax.nn``: NaN).

    Returns ``output [B, T, N, Hv]`` in the query's dtype, then, in this order, what is asked:
    ``return_weights``: ``weights [B, N, T, S]`` (float32); ``return_residual``: the
    log-sum-exp as ``jax.nn`` returns it, ``[B, T, N]`` in the query's dtype with its gradient
    stopped; ``return_lse``: attnjax's log-sum-exp ``[B, N, T]`` in float32, differentiable
    (sequence-parallel merges and pattern recomputation use it). Both are ``-inf`` for rows
    with no visible key (``jax.nn``: a large finite negative).

    ``implementation``: ``"xla"`` (dense: materializes the logits), ``"chunked"`` (online
    softmax over tiles in XLA, O(T) memory forward and backward), ``"pallas"`` (the Pallas
    kernel of the platform the call is lowered for, chosen when lowered: the Triton kernel for
    GPU, the Mosaic kernel for TPU, on CPU the Triton kernels in Pallas interpret mode; so
    ``jax.export(..., platforms=["tpu"])`` on a CPU, under an abstract TPU device, holds the
    Mosaic kernel; a call one kernel refuses raises when lowered for it), ``"pallas_triton"``
    (the Triton flash kernels, Pallas interpret mode off GPU: the named dot-product and additive
    scores, structured masks and mods, block masks), ``"pallas_tpu"`` (the Mosaic TPU flash
    kernel when lowered for TPU, Pallas' interpreter on CPU (slow: for tests), refused on a GPU:
    float32 or bfloat16, dot-family and additive scores, causal with offset, windows, lengths,
    segment ids, score and mask mods, block masks), ``"cudnn"`` (``jax.nn``'s cuDNN kernel: GPU,
    ``dot``/``scaled_dot``, no mods) or ``None``: :func:`choose_implementation` decides.
    Tiled implementations never form the weights, so ``return_weights=True`` with them is an
    error. ``block_sizes`` (:class:`attnjax.BlockSizes`) sets their tiles; each has defaults.
    See ``docs/tiled.md``.
    """
    options = dict(locals())  # every argument, for validation
    query, key, value, call, batched = prepare(**options)
    if implementation is None:
        implementation = _choose(call, query, key, return_weights)
    _check_implementation(implementation, return_weights, call)
    if implementation == "cudnn":
        output, weights, lse = _cudnn(query, key, value, call)
    else:
        output, weights, lse = IMPLEMENTATIONS[implementation](query, key, value, call)
    residual = jax.lax.stop_gradient(jnp.swapaxes(lse, 1, 2).astype(query.dtype))
    extras = (weights,) * return_weights + (residual,) * return_residual + (lse,) * return_lse
    if not batched:
        output, extras = output[0], tuple(x[0] for x in extras)
    return (output, *extras) if extras else output


def choose_implementation(query, key, value, *args, **kwargs) -> str:
    """What ``attention(query, key, value, *args, **kwargs)`` runs with ``implementation=None``.

    Dense (``"xla"``) when the weights are asked for or the logits are few (below
    ``CHUNKED_MIN_LOGITS`` per batch and head, measured on CPU) and no block mask is given;
    on GPU ``"cudnn"`` where it applies (plain ``dot``/``scaled_dot``: measured 1.8x the Pallas
    kernel), else ``"pallas"`` where it applies; on TPU ``"pallas"`` (the Mosaic kernel)
    where it takes the call (:func:`attnjax.pallas.tpu.refuses`: scores, masks, dtype, tiles,
    mods that lower), as splash attention is JAX's own choice there; else ``"chunked"``. The
    Mosaic kernel is proven in TPU interpret mode and by export but not yet timed on a chip
    (``benchmarks/tpu.sh``); ``implementation="chunked"`` keeps the XLA loop.
    """
    query, key, value, call, _ = prepare_call(query, key, value, *args, **kwargs)
    return _choose(call, query, key, kwargs.get("return_weights", False))


def prepare_call(
    query, key, value, *args, **kwargs
) -> tuple[Array, Array, Array, AttentionCall, bool]:
    """:func:`attnjax.call.prepare` for ``attention(query, key, value, *args, **kwargs)``:
    ``(query, key, value, call, batched)``, every argument checked."""
    options = inspect.signature(attention).bind(query, key, value, *args, **kwargs)
    options.apply_defaults()
    return prepare(**options.arguments)


def _choose(call: AttentionCall, query: Array, key: Array, return_weights: bool) -> str:
    num_queries, num_keys = query.shape[1], key.shape[1]
    if return_weights or (num_queries * num_keys < CHUNKED_MIN_LOGITS and call.block_mask is None):
        return "xla"
    if jax.default_backend() == "tpu":
        if tpu_refuses(call, query.dtype, num_queries, num_keys) is None:
            return "pallas"
    if jax.default_backend() == "gpu":
        if _cudnn_refuses(call) is None:
            return "cudnn"
        if unsupported(call) is None and triton_backend.missing() is None:
            return "pallas"
    return "chunked"


def _check_implementation(implementation: str, return_weights: bool, call: AttentionCall) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation: expected one of {sorted(IMPLEMENTATIONS)} or None, "
            f"got {implementation!r}"
        )
    if return_weights and implementation != "xla":
        raise ValueError(
            f"return_weights: implementation={implementation!r} never forms the [B, N, T, S] "
            "weights; use implementation='xla' (or None) to get them"
        )
    if call.block_sizes is not None and not isinstance(call.block_sizes, BlockSizes):
        raise TypeError(
            f"block_sizes: expected attnjax.BlockSizes or None, got {call.block_sizes!r}"
        )
    if implementation == "cudnn":
        reason = _cudnn_refuses(call)
        if reason is not None:
            raise ValueError(reason)


def _cudnn_refuses(call: AttentionCall) -> str | None:
    """Why ``jax.nn``'s cuDNN kernel cannot run this call, or ``None``."""
    spec = call.mask_spec
    dot = call.score_name in ("dot", "scaled_dot")
    scale = call.score_params.get("scale", 1.0) if dot else None
    reasons = {
        "a GPU backend": jax.default_backend() == "gpu",
        "score 'dot' or 'scaled_dot'": dot,
        "a fixed scalar scale": not dot
        or (not isinstance(scale, jax.core.Tracer) and jnp.size(scale) == 1),
        "no score_mod, mask_mod, block_mask, temperature or segment ids": not call.has_mods
        and call.block_mask is None
        and call.temperature is None
        and spec.q_segment_ids is None,
        "causal_offset 0": not isinstance(spec.offset, jax.core.Tracer) and int(spec.offset) == 0,
    }
    missing = [need for need, ok in reasons.items() if not ok]
    if not missing:
        return None
    return (
        f"implementation='cudnn' (jax.nn.dot_product_attention) needs {', '.join(missing)}; "
        "use implementation='pallas' or 'chunked'"
    )


def _cudnn(query, key, value, call: AttentionCall):
    """``jax.nn.dot_product_attention(implementation="cudnn")``: ``(output, None, lse)``
    (its residual ``[B, T, N]`` back in attnjax's float32 ``[B, N, T]``).

    Rows with no visible key follow cuDNN, not attnjax's convention (see ``docs/tiled.md``).
    """
    spec = call.mask_spec
    scale = float(call.score_params.get("scale", 1.0))
    output, lse = jax.nn.dot_product_attention(
        query,
        key,
        value,
        call.bias,
        call.mask,
        scale=scale,
        is_causal=spec.is_causal,
        query_seq_lengths=spec.q_lengths,
        key_value_seq_lengths=spec.kv_lengths,
        local_window_size=spec.window,
        implementation="cudnn",
        return_residual=True,
    )
    return output, None, jnp.swapaxes(lse, 1, 2).astype(jnp.float32)
