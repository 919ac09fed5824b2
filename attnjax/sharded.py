"""Sequence-parallel attention across devices: the query and key sequences sharded over a mesh
axis, every score, mask and mod of :func:`attnjax.attention` with global positions.

``strategy="all_gather"``: each device gathers the whole key/value sequence once and attends
from its own queries, whose global positions enter as ``causal_offset`` (so causal masks,
windows and mods see absolute indices). Gradients come from JAX's transpose of the gather
(a reduce-scatter of dK/dV). The ring strategy (K/V blocks passed with ``ppermute``) is not
implemented yet.
"""

from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, ArrayLike, Float, Int

from attnjax.attention import attention

STRATEGIES = ("all_gather",)
# Array arguments sharded along their sequence axis, and those every device holds whole; the
# others (scores and mods as functions, flags, windows) are static.
_SHARDED = {"q_segment_ids", "kv_segment_ids"}
_REPLICATED = {
    "score_params",
    "mod_params",
    "temperature",
    "query_seq_lengths",
    "key_value_seq_lengths",
}


def ring_attention(
    query: Float[ArrayLike, "B T N H"],
    key: Float[ArrayLike, "B S K H"],
    value: Float[ArrayLike, "B S K Hv"],
    *,
    mesh: Mesh,
    axis: str,
    strategy: str = "all_gather",
    causal_offset: Int[ArrayLike, ""] = 0,
    **attention_kwargs: Any,
) -> Float[Array, "B T N Hv"]:
    """:func:`attnjax.attention` with ``T`` and ``S`` sharded over ``mesh`` axis ``axis``.

    Inputs and output are global arrays in natural sequence order; ``T`` and ``S`` must be
    multiples of the axis size. ``attention_kwargs`` are ``attention``'s (scores and their
    parameters, ``is_causal``, windows, lengths, segment ids, temperature, score and mask mods
    with ``mod_params``): mods see global positions. ``bias`` and dense ``mask`` arrays are not
    taken (use a mod).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {list(STRATEGIES)}, got {strategy!r}")
    if axis not in mesh.axis_names:
        raise ValueError(f"axis: {axis!r} is not an axis of the mesh {mesh.axis_names}")
    for name in ("bias", "mask", "implementation", "return_weights", "return_residual"):
        if name in attention_kwargs:
            raise ValueError(f"{name}: not taken by ring_attention")
    shards = mesh.shape[axis]
    for name, length in (("query", query.shape[1]), ("key", key.shape[1])):
        if length % shards:
            raise ValueError(
                f"{name}: sequence length {length} is not a multiple of the {shards} shards "
                f"of mesh axis {axis!r}"
            )
    sharded = {n: v for n, v in attention_kwargs.items() if n in _SHARDED}
    replicated = {n: v for n, v in attention_kwargs.items() if n in _REPLICATED}
    static = {n: v for n, v in attention_kwargs.items() if n not in _SHARDED | _REPLICATED}
    seq = PartitionSpec(None, axis)

    def local(q, k, v, sharded, replicated):
        k, v = (jax.lax.all_gather(x, axis, axis=1, tiled=True) for x in (k, v))
        if "kv_segment_ids" in sharded:
            sharded = sharded | {
                "kv_segment_ids": jax.lax.all_gather(
                    sharded["kv_segment_ids"], axis, axis=1, tiled=True
                )
            }
        offset = causal_offset + jax.lax.axis_index(axis) * q.shape[1]
        return attention(
            q, k, v, causal_offset=offset, implementation="chunked",
            **sharded, **replicated, **static,
        )  # fmt: skip

    specs = {n: seq for n in sharded}
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(seq, seq, seq, specs, PartitionSpec()),
        out_specs=seq,
        check_vma=False,
    )(query, key, value, sharded, replicated)
