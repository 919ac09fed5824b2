""":func:`ring_attention`: sequence-parallel attention on global arrays over a mesh."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import ArrayLike, Bool, Float, Int

from attnjax.sharded.layout import Layout
from attnjax.sharded.ring import REPLICATED, SHARDED, check_kwargs, ring_attention_shard
from attnjax.tiling import as_4d


def ring_attention(
    query: Float[ArrayLike, "B T N H"],
    key: Float[ArrayLike, "B S K H"],
    value: Float[ArrayLike, "B S K Hv"],
    bias: Float[ArrayLike, "..."] | None = None,
    mask: Bool[ArrayLike, "..."] | None = None,
    *,
    mesh: Mesh,
    axis: str,
    strategy: str = "ring",
    layout: str | None = None,
    causal_offset: Int[ArrayLike, ""] = 0,
    return_lse: bool = False,
    implementation: str | None = None,
    **attention_kwargs: Any,
):
    """:func:`attnjax.attention` with ``T`` and ``S`` sharded over ``mesh`` axis ``axis``.

    Inputs and output are global arrays in natural sequence order (the output sharded along
    ``T`` over ``axis``). ``strategy``: ``"ring"`` (key/value shards passed around the ring,
    O(T/P) memory per device, forward and backward) or ``"all_gather"`` (keys and values
    gathered once). ``layout``: how positions are dealt to devices, ``"contiguous"`` or
    ``"zigzag"`` (balances causal work; the default when ``is_causal``); the reordering
    happens inside. ``T`` and ``S`` must be multiples of the layout's chunk count (``P``, or
    ``2P`` for zigzag). ``attention_kwargs`` are ``attention``'s: every score, lengths,
    segment ids, windows, temperature (scalar or per head), score and mask mods with
    ``mod_params``; rules and mods see global positions. ``bias`` and ``mask`` broadcast to
    ``[B, N, T, S]`` as in ``attention``; a ``T`` axis is sharded with the queries (each
    device holds its rows against all keys: O(T·S/P) memory, so mods are the scalable way).
    With ``return_lse`` also the log-sum-exp ``[B, N, T]``.
    ``implementation``: see :func:`ring_attention_shard`.
    """
    check_kwargs(strategy, attention_kwargs)
    if jnp.ndim(query) != 4:
        raise ValueError(
            f"query: expected [B, T, N, H] (batched: the sequence axis 1 is sharded), got shape "
            f"{jnp.shape(query)}"
        )
    if axis not in mesh.axis_names:
        raise ValueError(f"axis: {axis!r} is not an axis of the mesh {mesh.axis_names}")
    if layout is None:
        layout = "zigzag" if attention_kwargs.get("is_causal") else "contiguous"
    placement = Layout(layout, mesh.shape[axis])
    for name, x in (("query", query), ("key", key), ("value", value)):
        _check_placement(name, x, mesh)
        placement.check(name, x.shape[1])
    sharded = {n: x for n, x in attention_kwargs.items() if n in SHARDED and x is not None}
    replicated = {n: x for n, x in attention_kwargs.items() if n in REPLICATED}
    static = {n: x for n, x in attention_kwargs.items() if n not in sharded and n not in replicated}
    seq = PartitionSpec(None, axis)
    rows = {n: as_4d(x) for n, x in (("bias", bias), ("mask", mask)) if x is not None}
    row_specs = {n: PartitionSpec(None, None, axis) if x.shape[2] > 1 else PartitionSpec()
                 for n, x in rows.items()}  # fmt: skip
    local = functools.partial(
        ring_attention_shard, axis_name=axis, strategy=strategy, layout=layout,
        return_lse=True, implementation=implementation, **static,
    )  # fmt: skip

    def shard(q, k, v, rows, sharded, replicated, causal_offset):
        return local(q, k, v, causal_offset=causal_offset, **rows, **sharded, **replicated)

    out, lse = jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(
            seq,
            seq,
            seq,
            row_specs,
            {n: seq for n in sharded},
            PartitionSpec(),
            PartitionSpec(),
        ),
        out_specs=(seq, PartitionSpec(None, None, axis)),
        check_vma=False,
    )(query, key, value, rows, sharded, replicated, causal_offset)
    return (out, lse) if return_lse else out


def _check_placement(name: str, x: ArrayLike, mesh: Mesh) -> None:
    """An array already spread over devices must be on this mesh's devices."""
    sharding = getattr(x, "sharding", None)
    if sharding is None or isinstance(x, jax.core.Tracer) or len(sharding.device_set) == 1:
        return
    if sharding.device_set != set(mesh.devices.flat):
        mesh_of = sharding.mesh.shape if isinstance(sharding, NamedSharding) else sharding
        raise ValueError(
            f"{name}: sharded over other devices ({mesh_of}) than the mesh's "
            f"{dict(mesh.shape)}; pass the mesh the arrays live on, or move them with "
            "jax.device_put"
        )
