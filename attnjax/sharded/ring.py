"""Sequence-parallel attention on the local shards, inside ``shard_map``.

``strategy="ring"``: each device keeps its queries; the key/value shards travel around the
ring of devices (``ppermute`` to the next device, sent before the step's compute so the two can
overlap). At step ``s`` device ``d`` holds the keys of device ``(d - s) mod P`` and folds that
block into its running output by log-sum-exp. The backward pass (a custom VJP) runs the ring
again: each block's share of the gradients is computed with the merged log-sum-exp
(:func:`attnjax.chunked.chunked_share`), and dK/dV travel with their block until they are back
home. Memory per device is O(T/P) in both passes.

``strategy="all_gather"``: each device gathers all keys and values once (O(T) memory) and
attends from its own queries; gradients by JAX's transpose of the gather.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from attnjax.attention import attention, prepare_call
from attnjax.call import split_floats
from attnjax.pallas import unsupported
from attnjax.sharded.blocks import (
    Plan,
    block_forward,
    block_gradients,
    block_kwargs,
    merge,
    shifted_mods,
)
from attnjax.sharded.layout import Layout
from attnjax.tiling import as_4d

STRATEGIES = ("ring", "all_gather")
IMPLEMENTATIONS = ("chunked", "pallas")
# Array keywords sharded along the sequence (the keys' travel with them) and those every
# device holds whole; the other keywords (scores and mods as functions, flags) are static.
SHARDED = ("q_segment_ids", "kv_segment_ids")
ROWS = ("bias", "mask")  # [#B, #N, T or 1, S or 1]: sharded along T when it is there
REPLICATED = (
    "score_params",
    "mod_params",
    "temperature",
    "query_seq_lengths",
    "key_value_seq_lengths",
)
REFUSED = {
    "block_mask": "block masks are built per block from mask_mod",
    "return_weights": "the weights are never formed",
    "return_residual": "pass return_lse=True for the log-sum-exp [B, N, T]",
}


def ring_attention_shard(
    query: Float[Array, "B Tl N H"],
    key: Float[Array, "B Sl K H"],
    value: Float[Array, "B Sl K Hv"],
    bias: Float[Array, "..."] | None = None,
    mask: Bool[Array, "..."] | None = None,
    *,
    axis_name: str,
    strategy: str = "ring",
    layout: str = "contiguous",
    causal_offset: Int[ArrayLike, ""] = 0,
    return_lse: bool = False,
    implementation: str | None = None,
    **attention_kwargs: Any,
):
    """:func:`attnjax.attention` on this device's shards, inside ``shard_map`` over ``axis_name``.

    ``query [B, T/P, N, H]``, ``key``/``value [B, S/P, K, H]`` and the segment ids are the
    local shards of the natural (contiguous) sharding; ``layout="zigzag"`` deals them to the
    zigzag layout inside and the output back (:mod:`attnjax.sharded.layout`). ``bias`` and
    ``mask`` hold this device's query rows against all keys (``[#B, #N, T/P or 1, S or 1]``).
    Other keywords are ``attention``'s, whole on every device; rules and mods see global
    positions. Returns the local output
    ``[B, T/P, N, Hv]`` (and its log-sum-exp ``[B, N, T/P]`` with ``return_lse``).
    ``implementation`` runs the forward blocks: ``"chunked"`` or ``"pallas"`` (``None``: the
    Pallas kernel on GPU where it applies, else chunked); the ring's gradients use the chunked
    backward, the all-gather's the forward implementation's own.
    The enclosing ``shard_map`` must pass ``check_vma=False``.
    """
    if jax.typeof(query).manual_axis_type.varying:
        raise ValueError(
            "ring_attention_shard: call jax.shard_map with check_vma=False (the tiled loops "
            "do not track which values vary across devices)"
        )
    layout = Layout(layout, jax.lax.axis_size(axis_name))
    rows = {"bias": bias, "mask": mask}
    for name, x in rows.items():
        rows[name] = _local_rows(name, x, layout, axis_name, query.shape[1], key.shape[1])
    plan, diff, data, q_seg, kv_seg = _plan(
        query, key, value, axis_name, strategy, layout, causal_offset, implementation,
        attention_kwargs | rows,
    )  # fmt: skip

    def deal(*arrays):
        return [None if x is None else layout.deal(x, axis_name) for x in arrays]

    query, q_seg = deal(query, q_seg)
    if strategy == "ring":
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, *deal(key, value)))
        out, lse = _ring(plan, q, k, v, diff, data, q_seg, *deal(kv_seg))
        out = jnp.swapaxes(out, 1, 2)
    else:
        out, lse = _gathered(plan, query, key, value, diff, data, q_seg, kv_seg)
    out = layout.undeal(out.astype(query.dtype), axis_name)
    lse = layout.undeal(lse, axis_name, axis=2)
    return (out, lse) if return_lse else out


def _local_rows(name, x, layout, axis_name, num_queries, num_keys):
    """``bias`` or ``mask`` as 4-D local rows in the layout; ValueError for other shapes."""
    if x is None:
        return None
    x = as_4d(x)
    if x.shape[2] not in (1, num_queries) or x.shape[3] not in (1, num_keys * layout.shards):
        raise ValueError(
            f"{name}: shape {x.shape} on this device; expected [#B, #N, T/P or 1, S or 1] with "
            f"T/P = {num_queries} local queries and S = {num_keys * layout.shards} keys"
        )
    return layout.deal(x, axis_name, axis=2) if x.shape[2] > 1 else x


def check_kwargs(strategy: str, kwargs: dict[str, Any]) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {list(STRATEGIES)}, got {strategy!r}")
    for name, instead in REFUSED.items():
        if kwargs.get(name) is not None and kwargs.get(name) is not False:
            raise ValueError(f"{name}: not taken by sequence-parallel attention; {instead}")
    temperature = kwargs.get("temperature")
    if temperature is not None and jnp.shape(temperature)[-2:] not in ((), (1,), (1, 1)):
        raise ValueError(
            f"temperature: shape {jnp.shape(temperature)} varies along T or S; sequence-parallel "
            "attention takes a scalar or per-batch/per-head temperature ([B, N, 1, 1])"
        )


def _plan(query, key, value, axis_name, strategy, layout, offset, implementation, kwargs):
    """``(plan, diff, data, q_segment_ids, kv_segment_ids)``."""
    check_kwargs(strategy, kwargs)
    for name, x in (("query", query), ("key", key)):
        layout.check(f"{name} (local shard)", x.shape[1] * layout.shards)
    mod_floats, mod_data = split_floats(kwargs.get("mod_params"))
    diff = {"score_params": kwargs.get("score_params"), "temperature": kwargs.get("temperature"),
            "mod_params": mod_floats, "bias": kwargs.get("bias")}  # fmt: skip
    data = {n: kwargs.get(n) for n in ("query_seq_lengths", "key_value_seq_lengths", "mask")}
    data |= {"causal_offset": jnp.asarray(offset, jnp.int32), "mod_params": mod_data}
    arrays = (*SHARDED, *REPLICATED, *ROWS, *REFUSED)
    static = {n: x for n, x in kwargs.items() if n not in arrays}
    static |= shifted_mods(static.pop("score_mod", None), static.pop("mask_mod", None))
    implementation = _implementation(implementation, query, key, value, offset, kwargs)
    plan = Plan(axis_name, layout, strategy, implementation, tuple(sorted(static.items())))
    return plan, diff, data, kwargs.get("q_segment_ids"), kwargs.get("kv_segment_ids")


def _implementation(implementation, query, key, value, offset, kwargs) -> str:
    if implementation not in (None, *IMPLEMENTATIONS):
        raise ValueError(
            f"implementation: expected one of {list(IMPLEMENTATIONS)} or None, "
            f"got {implementation!r}"
        )
    if implementation is not None:
        return implementation
    if (
        jax.default_backend() != "gpu"
        or kwargs.get("bias") is not None
        or kwargs.get("mask") is not None
    ):
        return "chunked"  # the Pallas kernels take no dense bias or mask
    call = prepare_call(query, key, value, causal_offset=offset, **kwargs)[3]
    return "pallas" if unsupported(call) is None else "chunked"


def _chunk(x: Array | None, i: Int[ArrayLike, ""], n: int, axis: int = 1) -> Array | None:
    """Local chunk ``i`` of ``n`` along ``axis`` (``i`` may be traced)."""
    if x is None:
        return None
    size = x.shape[axis] // n
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis)


def _put(x: Array, chunk: Array, i: Int[ArrayLike, ""], axis: int = 1) -> Array:
    return jax.lax.dynamic_update_slice_in_dim(x, chunk, i * chunk.shape[axis], axis)


def _pairs(plan: Plan, device, source, q_length: int, kv_length: int):
    """``pair -> (i, j, q0, s0)``: the ``n × n`` blocks of one step, local query chunk ``i``
    of ``device`` (global start ``q0``) against key chunk ``j`` of ``source``'s shard."""
    n = plan.layout.chunks_per_device

    def blocks(pair):
        i, j = pair // n, pair % n
        q0 = plan.layout.chunk(device, i) * (q_length // n)
        return i, j, q0, plan.layout.chunk(source, j) * (kv_length // n)

    return n * n, blocks


def _gathered(plan: Plan, q, k, v, diff, data, q_seg, kv_seg):
    def gather(x):  # the natural shards
        return jax.lax.all_gather(x, plan.axis_name, axis=1, tiled=True)

    k, v = gather(k), gather(v)
    kv_seg = None if kv_seg is None else gather(kv_seg)
    me = jax.lax.axis_index(plan.axis_name)
    n = plan.layout.chunks_per_device
    blocks = []
    for i in range(n):
        q0 = plan.layout.chunk(me, i) * (q.shape[1] // n)
        kwargs = block_kwargs(
            plan, diff, data, _chunk(q_seg, i, n), kv_seg, q0, 0, row=i, num_keys=k.shape[1]
        )
        blocks.append(
            attention(_chunk(q, i, n), k, v, implementation=plan.implementation,
                      return_lse=True, **kwargs)
        )  # fmt: skip
    outs, lses = zip(*blocks, strict=True)
    return jnp.concatenate(outs, 1), jnp.concatenate(lses, 2)


def _ring_perm(plan: Plan) -> list[tuple[int, int]]:
    shards = plan.layout.shards
    return [(d, (d + 1) % shards) for d in range(shards)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(plan, q, k, v, diff, data, q_seg, kv_seg):
    return _ring_forward(plan, q, k, v, diff, data, q_seg, kv_seg)


def _ring_forward(plan, q, k, v, diff, data, q_seg, kv_seg):
    n, shards = plan.layout.chunks_per_device, plan.layout.shards
    me = jax.lax.axis_index(plan.axis_name)
    part = functools.partial(_chunk, n=n, axis=2)  # of a head-major [B, N, T, ...] array

    def step(s, carry):
        travelling, acc = carry
        ahead = jax.lax.ppermute(travelling, plan.axis_name, _ring_perm(plan))
        k, v, kv_seg = travelling
        count, blocks = _pairs(plan, me, (me - s) % shards, q.shape[2], k.shape[2])

        def pair(p, acc):
            i, j, q0, s0 = blocks(p)
            kwargs = block_kwargs(
                plan, diff, data, _chunk(q_seg, i, n), _chunk(kv_seg, j, n), q0, s0, row=i,
                num_keys=k.shape[2] // n,
            )  # fmt: skip
            block = block_forward(plan, part(q, i), part(k, j), part(v, j), kwargs)
            out, lse = merge((part(acc[0], i), part(acc[1], i)), block)
            return _put(acc[0], out, i, 2), _put(acc[1], lse, i, 2)

        return ahead, jax.lax.fori_loop(0, count, pair, acc)

    batch, heads, length = q.shape[:3]
    empty = (
        jnp.zeros((batch, heads, length, v.shape[-1]), jnp.float32),
        jnp.full((batch, heads, length), -jnp.inf, jnp.float32),
    )
    return jax.lax.fori_loop(0, shards, step, ((k, v, kv_seg), empty))[1]


def _ring_fwd(plan, q, k, v, diff, data, q_seg, kv_seg):
    out, lse = _ring_forward(plan, q, k, v, diff, data, q_seg, kv_seg)
    return (out, lse), (q, k, v, diff, data, q_seg, kv_seg, out, lse)


def _ring_bwd(plan, residuals, cotangents):
    q, k, v, diff, data, q_seg, kv_seg, out, lse = residuals
    d_out, d_lse = (c.astype(jnp.float32) for c in cotangents)
    n, shards = plan.layout.chunks_per_device, plan.layout.shards
    me = jax.lax.axis_index(plan.axis_name)
    part = functools.partial(_chunk, n=n, axis=2)
    zeros = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, jnp.float32))

    def step(s, carry):
        (k, v, kv_seg), (dk, dv), dq, d_diff = carry
        ahead = jax.lax.ppermute((k, v, kv_seg), plan.axis_name, _ring_perm(plan))
        count, blocks = _pairs(plan, me, (me - s) % shards, q.shape[2], k.shape[2])

        def pair(p, grads):
            i, j, q0, s0 = blocks(p)
            kwargs_of = functools.partial(
                block_kwargs, plan, data=data, q_seg=_chunk(q_seg, i, n),
                kv_seg=_chunk(kv_seg, j, n), q0=q0, s0=s0, row=i, num_keys=k.shape[2] // n,
            )  # fmt: skip
            rows = [part(x, i) for x in (out, lse, d_out, d_lse)]
            dq_t, dk_t, dv_t, d_diff_t = block_gradients(
                plan, part(q, i), part(k, j), part(v, j), diff, kwargs_of, *rows
            )
            dq, dk, dv, d_diff = grads
            return (
                _put(dq, part(dq, i) + dq_t, i, 2),
                _put(dk, part(dk, j) + dk_t, j, 2),
                _put(dv, part(dv, j) + dv_t, j, 2),
                jax.tree.map(jnp.add, d_diff, d_diff_t),
            )

        dq, dk, dv, d_diff = jax.lax.fori_loop(0, count, pair, (dq, dk, dv, d_diff))
        back = jax.lax.ppermute((dk, dv), plan.axis_name, _ring_perm(plan))
        return ahead, back, dq, d_diff

    init = ((k, v, kv_seg), zeros((k, v)), zeros(q), zeros(diff))
    _, (dk, dv), dq, d_diff = jax.lax.fori_loop(0, shards, step, init)
    cast = functools.partial(jax.tree.map, lambda g, x: g.astype(x.dtype))
    return (*cast((dq, dk, dv), (q, k, v)), cast(d_diff, diff), None, None, None)


_ring.defvjp(_ring_fwd, _ring_bwd)
