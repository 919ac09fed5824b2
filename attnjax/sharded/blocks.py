"""One block of sequence-parallel attention: a contiguous chunk of queries against a contiguous
chunk of keys, anywhere in the global sequences.

A block is an ordinary :func:`attnjax.attention` call whose arguments are shifted so that every
rule sees global positions: ``causal_offset + q0 - s0`` for the causal and window rules,
lengths minus the chunk starts, and mods that get ``q_idx`` and ``kv_idx`` shifted by ``s0``
(through ``mod_params["shift"]``, so one compiled block serves every step). Blocks merge by
log-sum-exp; their gradients come from :func:`attnjax.chunked.chunked_share`, normalized by the
merged log-sum-exp.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from attnjax.attention import attention, prepare_call
from attnjax.call import merge_floats
from attnjax.chunked import chunked_share
from attnjax.masks import EMPTY, MaskSpec
from attnjax.sharded.layout import Layout
from attnjax.tiling import BlockSizes

Output = tuple[Float[Array, "B N T Hv"], Float[Array, "B N T"]]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The static part of a sharded call: the mesh axis, the layout, the strategy, the
    implementation of the forward blocks, and ``attention``'s static keywords (mods shifted)."""

    axis_name: str
    layout: Layout
    strategy: str
    implementation: str
    static: tuple[tuple[str, Any], ...]

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.static)


def shifted_mods(score_mod, mask_mod) -> dict[str, Any]:
    """The mods, taking ``{"mods": mod_params, "shift": s0}`` and shifting both indices."""
    mods = {}
    if score_mod is not None:

        def shifted_score(logits, b, h, q_idx, kv_idx, params):
            shift = params["shift"][...]  # a ref inside Pallas kernels: load it
            return score_mod(logits, b, h, q_idx + shift, kv_idx + shift, params["mods"])

        mods["score_mod"] = shifted_score
    if mask_mod is not None:

        def shifted_mask(b, h, q_idx, kv_idx, params):
            shift = params["shift"][...]  # a ref inside Pallas kernels: load it
            return mask_mod(b, h, q_idx + shift, kv_idx + shift, params["mods"])

        mods["mask_mod"] = shifted_mask
    return mods


def block_kwargs(plan: Plan, diff, data, q_seg, kv_seg, q0, s0, *, row, num_keys) -> dict[str, Any]:
    """``attention``'s keywords for the block whose queries (local chunk ``row``) start at
    global position ``q0`` and whose ``num_keys`` keys start at ``s0``. ``diff`` holds the
    differentiable arrays (score parameters, temperature, bias rows, float mod parameters),
    ``data`` the others."""
    options = plan.options
    kwargs = {**options, "causal_offset": data["causal_offset"] + q0 - s0}
    n = plan.layout.chunks_per_device
    for name, rows in (("bias", diff["bias"]), ("mask", data["mask"])):
        if rows is not None:
            kwargs[name] = _block_of(rows, row, n, s0, num_keys)
    for name, start in (("query_seq_lengths", q0), ("key_value_seq_lengths", s0)):
        if data[name] is not None:
            kwargs[name] = data[name] - start
    if q_seg is not None:
        kwargs |= {"q_segment_ids": q_seg, "kv_segment_ids": kv_seg}
    kwargs |= {k: diff[k] for k in ("score_params", "temperature") if diff[k] is not None}
    if "score_mod" in options or "mask_mod" in options:
        mods = merge_floats(diff["mod_params"], data["mod_params"])
        kwargs["mod_params"] = {"mods": mods, "shift": jnp.asarray(s0, jnp.int32)}
    return kwargs


def _block_of(rows: Array, row, n: int, s0, num_keys: int) -> Array:
    """The block of a ``[#B, #N, #T/P, #S]`` array of this device's query rows: local row
    chunk ``row`` of ``n`` and key columns ``s0 … s0 + num_keys`` (axes of size 1 are kept)."""
    if rows.shape[2] > 1:
        size = rows.shape[2] // n
        rows = jax.lax.dynamic_slice_in_dim(rows, row * size, size, 2)
    if rows.shape[3] > 1:
        rows = jax.lax.dynamic_slice_in_dim(rows, s0, num_keys, 3)
    return rows


def _visible(plan: Plan, kwargs, num_queries: int, num_keys: int) -> Array | None:
    """Whether the causal, window and length rules leave any pair of the block visible
    (``None``: no such rule, always)."""
    options = plan.options
    window = options.get("local_window_size")
    spec = MaskSpec(
        is_causal=bool(options.get("is_causal", False)),
        window=(window, window) if isinstance(window, int) else window,
        offset=kwargs["causal_offset"],
        q_lengths=kwargs.get("query_seq_lengths"),
        kv_lengths=kwargs.get("key_value_seq_lengths"),
    )
    if not spec.active:
        return None
    kinds = spec.classify(num_queries, num_keys, BlockSizes(num_queries, num_keys))
    return jnp.max(kinds) > EMPTY


def _skip_unless(visible, run, skipped):
    return run() if visible is None else jax.lax.cond(visible, run, skipped)


def _tokens(x: Array) -> Array:
    """``[B, N, T, H] <-> [B, T, N, H]``. The ring keeps arrays head-major, as the tiled
    loops use them; swapping inside the skip's branches lets XLA cancel the transposes."""
    return jnp.swapaxes(x, 1, 2)


def block_forward(plan: Plan, q, k, v, kwargs) -> Output:
    """The block's ``(output [B, N, T, Hv] in float32, log-sum-exp [B, N, T])`` from
    head-major ``q``, ``k``, ``v``; ``(0, -inf)`` when nothing in it is visible, without
    computing it."""

    def run():
        out, lse = attention(
            *map(_tokens, (q, k, v)), implementation=plan.implementation,
            return_lse=True, **kwargs,
        )  # fmt: skip
        return _tokens(out).astype(jnp.float32), lse

    def skipped():
        out = jnp.zeros((*q.shape[:3], v.shape[-1]), jnp.float32)
        return out, jnp.full(q.shape[:3], -jnp.inf, jnp.float32)

    return _skip_unless(_visible(plan, kwargs, q.shape[2], k.shape[2]), run, skipped)


def block_gradients(plan: Plan, q, k, v, diff, kwargs_of, out, lse, d_out, d_lse):
    """Cotangents of head-major ``(q, k, v)`` and of ``diff`` from this block, given the
    merged ``out`` (head-major) and ``lse`` of the rows and their cotangents;
    ``kwargs_of(diff)`` gives the block's keywords."""

    def share(q, k, v, diff):
        query, key, value, call, _ = prepare_call(*map(_tokens, (q, k, v)), **kwargs_of(diff))
        return chunked_share(query, key, value, call, _tokens(out), lse)

    def run():
        _, vjp = jax.vjp(share, q, k, v, diff)
        return vjp((_tokens(d_out), d_lse))

    def skipped():
        return jax.tree.map(jnp.zeros_like, (q, k, v, diff))

    visible = _visible(plan, kwargs_of(diff), q.shape[2], k.shape[2])
    return _skip_unless(visible, run, skipped)


def merge(a: Output, b: Output) -> Output:
    """Two blocks' ``(output [B, N, T, Hv], log-sum-exp)`` over disjoint keys as one; empty
    rows stay ``(0, -inf)``."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = jnp.logaddexp(lse_a, lse_b)
    safe = jnp.where(jnp.isneginf(lse), 0.0, lse)

    def weight(block_lse):
        return jnp.exp(block_lse - safe)[..., None]

    return weight(lse_a) * out_a + weight(lse_b) * out_b, lse
