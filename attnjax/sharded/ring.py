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
from jaxtyping import Array, ArrayLike, Float, Int

from attnjax.attention import prepare_call
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

STRATEGIES = ("ring", "all_gather")
IMPLEMENTATIONS = ("chunked", "pallas")
# Array keywords sharded along the sequence (the keys' travel with them) and those every
# device holds whole; the other keywords (scores and mods as functions, flags) are static.
SHARDED = ("q_segment_ids", "kv_segment_ids")
REPLICATED = (
    "score_params",
    "mod_params",
    "temperature",
    "query_seq_lengths",
    "key_value_seq_lengths",
)
REFUSED = {
    "bias": "use a score_mod",
    "mask": "use a mask_mod or the structured masks",
    "block_mask": "block masks are built per block from mask_mod",
    "return_weights": "the weights are never formed",
}


def ring_attention_shard(
    query: Float[Array, "B Tl N H"],
    key: Float[Array, "B Sl K H"],
    value: Float[Array, "B Sl K Hv"],
    *,
    axis_name: str,
    strategy: str = "ring",
    layout: str = "contiguous",
    causal_offset: Int[ArrayLike, ""] = 0,
    return_residual: bool = False,
    implementation: str | None = None,
    **attention_kwargs: Any,
):
    """:func:`attnjax.attention` inside ``shard_map``, on this device's shards of a sequence
    split over mesh axis ``axis_name``.

    ``query [B, T/P, N, H]``, ``key``/``value [B, S/P, K, H]`` and the segment ids are the
    local shards, holding positions as ``layout`` says (:mod:`attnjax.sharded.layout`;
    ``"contiguous"`` is the natural sharding). Other keywords are ``attention``'s, whole on
    every device; rules and mods see global positions. Returns the local output
    ``[B, T/P, N, Hv]`` (and its log-sum-exp ``[B, N, T/P]`` with ``return_residual``).
    ``implementation`` runs the forward blocks: ``"chunked"`` or ``"pallas"`` (``None``: the
    Pallas kernel on GPU where it applies, else chunked); gradients use the chunked backward.
    The enclosing ``shard_map`` must pass ``check_vma=False``.
    """
    if jax.typeof(query).manual_axis_type.varying:
        raise ValueError(
            "ring_attention_shard: call jax.shard_map with check_vma=False (the tiled loops "
            "do not track which values vary across devices)"
        )
    layout = Layout(layout, jax.lax.axis_size(axis_name))
    plan, diff, data, q_seg, kv_seg = _plan(
        query, key, value, axis_name, strategy, layout, causal_offset, implementation,
        attention_kwargs,
    )  # fmt: skip
    if strategy == "ring":
        out, lse = _ring(plan, query, key, value, diff, data, q_seg, kv_seg)
    else:
        out, lse = _gathered(plan, query, key, value, diff, data, q_seg, kv_seg)
    out = out.astype(query.dtype)
    return (out, lse) if return_residual else out


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
            "mod_params": mod_floats}  # fmt: skip
    data = {name: kwargs.get(name) for name in ("query_seq_lengths", "key_value_seq_lengths")}
    data |= {"causal_offset": jnp.asarray(offset, jnp.int32), "mod_params": mod_data}
    static = {n: x for n, x in kwargs.items() if n not in (*SHARDED, *REPLICATED, *REFUSED)}
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
    if jax.default_backend() != "gpu":
        return "chunked"
    call = prepare_call(query, key, value, causal_offset=offset, **kwargs)[3]
    return "pallas" if unsupported(call) is None else "chunked"


def _split(x: Array | None, n: int, axis: int = 1) -> list[Array | None]:
    return [None] * n if x is None else jnp.split(x, n, axis=axis)


def _starts(plan: Plan, device, length: int) -> list[Array]:
    """The global start of each local chunk of ``device`` for a local sequence of ``length``."""
    n = plan.layout.chunks_per_device
    return [plan.layout.chunk(device, i) * (length // n) for i in range(n)]


def _gathered(plan: Plan, q, k, v, diff, data, q_seg, kv_seg):
    def gather(x):
        whole = jax.lax.all_gather(x, plan.axis_name, axis=1, tiled=True)
        return plan.layout.from_devices(whole)

    k, v = gather(k), gather(v)
    kv_seg = None if kv_seg is None else gather(kv_seg)
    me = jax.lax.axis_index(plan.axis_name)
    n = plan.layout.chunks_per_device
    chunks = zip(_split(q, n), _split(q_seg, n), _starts(plan, me, q.shape[1]), strict=True)
    return _joined(
        [
            block_forward(plan, q_i, k, v, block_kwargs(plan, diff, data, seg_i, kv_seg, q0, 0))
            for q_i, seg_i, q0 in chunks
        ]
    )


def _joined(chunks: list[tuple[Array, Array]]) -> tuple[Array, Array]:
    """Local chunks' ``(output, lse)`` as the shard's."""
    outs, lses = zip(*chunks, strict=True)
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
    qs, q_segs = _split(q, n), _split(q_seg, n)
    q_starts = _starts(plan, me, q.shape[1])

    def step(s, carry):
        travelling, acc = carry
        ahead = jax.lax.ppermute(travelling, plan.axis_name, _ring_perm(plan))
        k, v, kv_seg = travelling
        s_starts = _starts(plan, (me - s) % shards, k.shape[1])
        blocks = list(zip(_split(k, n), _split(v, n), _split(kv_seg, n), s_starts, strict=True))
        for i in range(n):
            for k_j, v_j, seg_j, s0 in blocks:
                kwargs = block_kwargs(plan, diff, data, q_segs[i], seg_j, q_starts[i], s0)
                acc[i] = merge(acc[i], block_forward(plan, qs[i], k_j, v_j, kwargs))
        return ahead, acc

    batch, length, heads = q.shape[:3]
    empty = (
        jnp.zeros((batch, length // n, heads, v.shape[-1]), jnp.float32),
        jnp.full((batch, heads, length // n), -jnp.inf, jnp.float32),
    )
    _, acc = jax.lax.fori_loop(0, shards, step, ((k, v, kv_seg), [empty] * n))
    return _joined(acc)


def _ring_fwd(plan, q, k, v, diff, data, q_seg, kv_seg):
    out, lse = _ring_forward(plan, q, k, v, diff, data, q_seg, kv_seg)
    return (out, lse), (q, k, v, diff, data, q_seg, kv_seg, out, lse)


def _ring_bwd(plan, residuals, cotangents):
    q, k, v, diff, data, q_seg, kv_seg, out, lse = residuals
    d_out, d_lse = (c.astype(jnp.float32) for c in cotangents)
    n, shards = plan.layout.chunks_per_device, plan.layout.shards
    me = jax.lax.axis_index(plan.axis_name)
    by_rows = ((q, 1), (q_seg, 1), (out, 1), (lse, 2), (d_out, 1), (d_lse, 2))
    rows = [_split(x, n, axis) for x, axis in by_rows]
    q_starts = _starts(plan, me, q.shape[1])
    zeros = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, jnp.float32))

    def step(s, carry):
        (k, v, kv_seg), (dk, dv), dq, d_diff = carry
        ahead = jax.lax.ppermute((k, v, kv_seg), plan.axis_name, _ring_perm(plan))
        s_starts = _starts(plan, (me - s) % shards, k.shape[1])
        ks, vs, segs = _split(k, n), _split(v, n), _split(kv_seg, n)
        dks, dvs, dq = _split(dk, n), _split(dv, n), list(dq)
        for i, (q_i, seg_i, out_i, lse_i, d_out_i, d_lse_i) in enumerate(zip(*rows, strict=True)):
            for j in range(n):
                kwargs_of = functools.partial(
                    block_kwargs, plan, data=data, q_seg=seg_i, kv_seg=segs[j],
                    q0=q_starts[i], s0=s_starts[j],
                )  # fmt: skip
                grads = block_gradients(
                    plan, q_i, ks[j], vs[j], diff, kwargs_of, out_i, lse_i, d_out_i, d_lse_i
                )
                dq[i], dks[j], dvs[j], d_diff = jax.tree.map(
                    jnp.add, (dq[i], dks[j], dvs[j], d_diff), grads
                )
        back = jax.lax.ppermute(
            (jnp.concatenate(dks, 1), jnp.concatenate(dvs, 1)), plan.axis_name, _ring_perm(plan)
        )
        return ahead, back, dq, d_diff

    init = ((k, v, kv_seg), zeros((k, v)), zeros(rows[0]), zeros(diff))
    _, (dk, dv), dq, d_diff = jax.lax.fori_loop(0, shards, step, init)
    dq = jnp.concatenate(dq, 1)
    cast = functools.partial(jax.tree.map, lambda g, x: g.astype(x.dtype))
    return (*cast((dq, dk, dv), (q, k, v)), cast(d_diff, diff), None, None, None)


_ring.defvjp(_ring_fwd, _ring_bwd)
