"""Attention patterns of chosen heads and query rows, recomputed from the saved log-sum-exp.

The tiled paths (``"chunked"``, ``"pallas"``, :mod:`attnjax.sharded`) never form the
``[B, N, T, S]`` weights. With ``return_lse=True`` they return the log-sum-exp ``[B, N, T]``,
from which the weights of any query row follow exactly: ``exp(logits - lse)``.
:func:`attention_rows` computes the logits of the chosen rows only, against all keys, with the
call's own logit and mask rules (:meth:`attnjax.call.AttentionCall.logits` and
:meth:`~attnjax.call.AttentionCall.element_mask`, the functions every implementation uses), so
a 32k-token model's pattern for a few rows costs O(rows × S) memory while the model runs on its
fast path. See ``docs/inspect.md``.
"""

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from attnjax.attention import prepare_call
from attnjax.call import AttentionCall
from attnjax.scores import SCORES
from attnjax.softmax import recomputed_probs

# rows=None asks for every row: allowed up to this many logits per batch and head (4096²,
# 64 MiB of float32 weights per head); longer sequences must choose their rows.
FULL_PATTERN_MAX_LOGITS = 4096 * 4096


def attention_rows(
    query: Float[ArrayLike, "*B T N H"],
    key: Float[ArrayLike, "*B S K H"],
    lse: Float[ArrayLike, "..."],  # [*B, N, T], checked with a message naming return_lse
    rows: Int[ArrayLike, " R"] | Sequence[int] | None,
    bias: Float[ArrayLike, "..."] | None = None,
    mask: Bool[ArrayLike, "..."] | None = None,
    *,
    heads: Int[ArrayLike, " M"] | Sequence[int] | None = None,
    **attention_kwargs: Any,
) -> Float[Array, "*B M R S"]:
    """The attention weights ``[B, M, R, S]`` of query ``rows`` and ``heads``, from ``lse``.

    ``query``, ``key``, ``bias``, ``mask`` and ``attention_kwargs`` are those given to
    :func:`attnjax.attention` (or ``ring_attention``, less its ``mesh``, ``axis``,
    ``strategy`` and ``layout``); ``lse [B, N, T]`` is what it returned with
    ``return_lse=True``. ``rows`` are query positions ``t`` in ``[0, T)`` (as ``weights[..., t,
    :]`` indexes; mods see them shifted by ``causal_offset``, as in the call); ``heads`` are
    query heads in ``[0, N)`` (``None``: all). Both are 1-D integer sequences or arrays (arrays
    may be traced).

    The weights are ``exp(logits - lse)`` with the call's logits, masks and mods evaluated on
    those rows only: O(B · M · R · S) memory (and one copy of the chosen heads' keys), never
    ``T × S``. Masked keys and rows with no
    visible key (``lse = -inf``) get 0, as in ``attention(..., return_weights=True)``, which
    they equal up to float32 rounding. Named scores are evaluated on the chosen heads only
    (their per-head parameters sliced, mods seeing the heads' own indices); a callable score
    is evaluated on all ``N`` heads of the rows (its parameters are opaque), then the heads
    are taken.

    ``rows=None`` asks for the full ``[T, S]`` pattern: allowed while ``T · S`` is at most
    ``FULL_PATTERN_MAX_LOGITS`` (4096²), else a ``ValueError`` pointing to ``rows=``.
    Keywords of ``attention`` that only choose how it runs (``implementation``,
    ``block_sizes``, ``return_*``) are accepted and ignored, so one keyword dict serves both.
    """
    query, key, call, selection, batched = _rows_call(
        query, key, rows, heads, bias, mask, attention_kwargs
    )
    rows, head_ids, _ = selection
    batch, num_queries, num_heads, _ = query.shape
    lse = _check_lse(lse, (batch, num_heads, num_queries), batched)
    logits, element_mask = _rows_logits(query, key, call, selection)
    if head_ids is not None:
        lse = jnp.take(lse, head_ids, axis=1)
    weights = recomputed_probs(logits, jnp.take(lse, rows, axis=2), element_mask)
    return weights if batched else weights[0]


def logit_rows(
    query: Float[ArrayLike, "*B T N H"],
    key: Float[ArrayLike, "*B S K H"],
    rows: Int[ArrayLike, " R"] | Sequence[int] | None,
    bias: Float[ArrayLike, "..."] | None = None,
    mask: Bool[ArrayLike, "..."] | None = None,
    *,
    heads: Int[ArrayLike, " M"] | Sequence[int] | None = None,
    **attention_kwargs: Any,
) -> Float[Array, "*B M R S"]:
    """The logits ``[B, M, R, S]`` of query ``rows`` and ``heads`` (score, bias, temperature
    and ``score_mod``, float32), masked keys ``-inf``: what the softmax of
    :func:`attention_rows` reads, with its arguments (less ``lse``) and its limits."""
    query, key, call, selection, batched = _rows_call(
        query, key, rows, heads, bias, mask, attention_kwargs
    )
    logits, element_mask = _rows_logits(query, key, call, selection)
    if element_mask is not None:
        logits = jnp.where(element_mask, logits, -jnp.inf)
    return logits if batched else logits[0]


def _rows_call(query, key, rows, heads, bias, mask, attention_kwargs):
    """The checked call of :func:`attention_rows`: ``(query, key, call, (rows, head_ids,
    restricted), batched)``; ``restricted``: the call was restricted to ``head_ids`` (a named
    score, whose per-head parameters can be sliced)."""
    query, key, _, call, batched = prepare_call(query, key, key, bias, mask, **attention_kwargs)
    rows = _check_indices("rows", rows, query.shape[1], key.shape[1])
    head_ids = _check_indices("heads", heads, query.shape[2], None)
    params = _head_params(call, head_ids, query.shape[2])
    restricted = head_ids is not None and params is not None
    if restricted:
        call = _on_heads(call, head_ids, params)
    return query, key, call, (rows, head_ids, restricted), batched


def _rows_logits(query, key, call: AttentionCall, selection):
    """The logits ``[B, M, R, S]`` of the selection's rows and heads (``None``: all) and
    their element mask (``None``: none). A call not restricted to the heads (a callable
    score) is evaluated on all heads, then the heads are taken."""
    rows, head_ids, restricted = selection
    batch, _, num_heads, _ = query.shape
    num_keys = key.shape[1]
    group = num_heads // key.shape[2]
    q = jnp.swapaxes(jnp.take(query, rows, axis=1), 1, 2)  # [B, N, R, H]
    if restricted:
        q = jnp.take(q, head_ids, axis=1)
        k = jnp.swapaxes(jnp.take(key, head_ids // group, axis=2), 1, 2)
    else:
        k = jnp.swapaxes(jnp.repeat(key, group, axis=2), 1, 2)  # [B, N, S, H]
    rows_call = dataclasses.replace(
        call,
        bias=_take_rows(call.bias, rows),
        mask=_take_rows(call.mask, rows),
        temperature=_take_rows(call.temperature, rows),
    )
    k_idx = jnp.arange(num_keys)
    logits = rows_call.logits(
        q,
        k,
        rows,
        k_idx,
        rows_call.score_params,
        rows_call.bias,
        rows_call.temperature,
        rows_call.mod_params,
    )
    shape = (batch, q.shape[1])
    element_mask = rows_call.element_mask(shape, rows, k_idx, rows_call.mask, rows_call.mod_params)
    if head_ids is not None and not restricted:
        logits = jnp.take(logits, head_ids, axis=1)
        if element_mask is not None and element_mask.shape[1] != 1:
            element_mask = jnp.take(element_mask, head_ids, axis=1)
    return logits, element_mask


def _check_lse(lse: ArrayLike, shape: tuple[int, int, int], batched: bool) -> Array:
    lse = jnp.asarray(lse)
    expected = shape if batched else shape[1:]
    if lse.shape != expected or not jnp.issubdtype(lse.dtype, jnp.floating):
        raise ValueError(
            f"lse: expected the log-sum-exp [B, N, T] = {list(expected)} that attention(..., "
            f"return_lse=True) returns for these inputs, got {lse.dtype} {list(lse.shape)} "
            "(return_residual's [B, T, N] is another layout)"
        )
    lse = lse.astype(jnp.float32)
    return lse if batched else lse[None]


def _check_indices(name: str, idx: Any, size: int, num_keys: int | None):
    """``idx`` as a 1-D int32 array, range-checked when concrete; ``None`` for all heads, and
    for all rows while the full pattern is small enough."""
    if idx is None:
        if num_keys is None:
            return None
        if size * num_keys > FULL_PATTERN_MAX_LOGITS:
            raise ValueError(
                f"rows=None asks for the full [T, S] = [{size}, {num_keys}] pattern, "
                f"{size * num_keys} logits per batch and head (at most "
                f"{FULL_PATTERN_MAX_LOGITS} without a row selection); pass rows=[t, ...] "
                "(query positions) to recompute those rows only, in O(rows × S) memory"
            )
        return jnp.arange(size, dtype=jnp.int32)
    arr = jnp.asarray(idx)
    if arr.ndim != 1 or not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(
            f"{name}: expected a 1-D integer array of positions, got {arr.dtype} {list(arr.shape)}"
        )
    if not isinstance(arr, jax.core.Tracer):
        values = np.asarray(arr)
        if values.size and (values.min() < 0 or values.max() >= size):
            bound = "T" if name == "rows" else "N"
            raise ValueError(f"{name}: expected values in [0, {bound}) = [0, {size}), got {idx}")
    return arr.astype(jnp.int32)


def _head_params(call: AttentionCall, head_ids, num_heads: int):
    """The score parameters of the chosen heads (leading ``N`` dims sliced), or ``None`` when
    they cannot be sliced (a callable score's parameters are opaque)."""
    if head_ids is None or call.score_name is None:
        return None
    trailing = SCORES[call.score_name].params
    sliced = {}
    for name, value in call.score_params.items():
        lead = value.shape[: value.ndim - len(trailing[name])]
        sliced[name] = jnp.take(value, head_ids, axis=0) if lead == (num_heads,) else value
    return sliced


def _on_heads(call: AttentionCall, head_ids, score_params) -> AttentionCall:
    """``call`` on the heads ``head_ids`` (``None``: unchanged heads): per-head ``bias``,
    ``mask`` and ``temperature`` taken, mods seeing the original head indices."""

    def heads_of(x):
        if x is None or head_ids is None or x.shape[1] == 1:
            return x
        return jnp.take(x, head_ids, axis=1)

    def remapped(mod):
        if mod is None or head_ids is None:
            return mod

        @functools.wraps(mod)
        def on_heads(*args):
            *before, h, q_idx, kv_idx, params = args
            return mod(*before, jnp.take(head_ids, h), q_idx, kv_idx, params)

        return on_heads

    return dataclasses.replace(
        call,
        score_params=score_params,
        bias=heads_of(call.bias),
        mask=heads_of(call.mask),
        temperature=heads_of(call.temperature),
        score_mod=remapped(call.score_mod),
        mask_mod=remapped(call.mask_mod),
    )


def _take_rows(x: Array | None, rows: Array) -> Array | None:
    """The rows of a 4-D block-broadcast array (a size-1 query axis is shared)."""
    if x is None or x.shape[2] == 1:
        return x
    return jnp.take(x, rows, axis=2)
