"""``implementation="pallas"``: folds each named score into inputs of the flash kernels.

``dot``, ``scaled_dot``, ``cosine`` and ``bilinear`` become plain ``q' · k'`` (scale,
normalization, ``W`` and the temperature folded into ``q'`` and ``k'``); ``additive`` and
``additive_relu`` become ``w · act(q W_q + b + k W_k)`` with ``w = v / temperature``. The
folding is ordinary JAX, so gradients reach ``score_params`` and ``temperature`` through it;
the kernels differentiate the rest with their own backward passes.

Score and mask mods are traced into the kernels, which then follow the tile schedule of the
block mask (:mod:`attnjax.pallas.mods`). The kernels target GPUs (Triton); elsewhere they run
in Pallas interpret mode (slow: for tests). Callables, dense boolean masks, ``bias`` and mods
that do not lower for Triton are refused: use ``"chunked"``. On a JAX without the Pallas Triton
backend, GPU calls are refused with a message naming ``"chunked"`` and ``"cudnn"``
(:mod:`attnjax.pallas.triton_backend`).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float

from attnjax.call import AttentionCall
from attnjax.masks import MaskSpec
from attnjax.masks.checks import check_closure
from attnjax.pallas.flash import Additive, Config, Dot, Extras, flash
from attnjax.pallas.mods import lowering_error, padded_leaves, schedules, with_mod_gradients
from attnjax.scores import _unit
from attnjax.tiling import BlockSizes, as_4d, pad_axis, round_up

# The fastest tried on an H200 (docs/performance.md): 16-bit inputs take larger tiles than
# float32, whose full-precision matmuls need more registers.
DEFAULT_BLOCKS = {2: BlockSizes(block_q=128, block_k=64), 4: BlockSizes(block_q=32, block_k=64)}
# Additive tiles form [block_q, block_k, A] on chip.
DEFAULT_ADDITIVE_BLOCKS = BlockSizes(block_q=16, block_k=32)
# The kernels' tile score for each named score (dot-family scores are folded into q and k).
TILE_SCORES = {
    "dot": Dot(),
    "scaled_dot": Dot(),
    "cosine": Dot(),
    "bilinear": Dot(),
    "additive": Additive("tanh"),
    "additive_relu": Additive("relu"),
}


def pallas_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
    interpret: bool | None = None,
) -> tuple[Float[Array, "B T N Hv"], None, Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, None, log-sum-exp)``.

    Same contract as :func:`attnjax.chunked.chunked_attention`. Block sizes must be powers of
    two (Triton); they are clamped to the next power of two of each sequence length, which is
    padded to whole blocks inside. ``interpret``: ``None`` compiles the kernels on a GPU (its
    mods checked first by :func:`lowering_error`) and interprets them elsewhere; ``True`` or
    ``False`` forces either, unchecked (:mod:`attnjax.pallas.platform` checks when lowered).
    """
    checked = interpret is None
    interpret = jax.default_backend() != "gpu" if checked else interpret
    reason = unsupported(call) or (lowering_error(call) if checked and not interpret else None)
    if reason is not None:
        raise ValueError(reason)
    tile_score = TILE_SCORES[call.score_name]
    additive = isinstance(tile_score, Additive)
    batch, num_queries, num_heads, _ = query.shape
    num_keys = key.shape[1]
    requested = call.blocks(None)
    blocks = _check_blocks(requested, additive, query.dtype, num_queries, num_keys)
    if call.block_mask is not None and blocks != requested:
        raise ValueError(
            f"block_mask: its tiles {requested} are not the kernel's {blocks} (powers of two "
            "no larger than the next power of two of each length); build it with those"
        )
    tq, ts = round_up(num_queries, blocks.block_q), round_up(num_keys, blocks.block_k)

    temperature = as_4d(call.temperature)
    if additive:
        q, k, w = fold_additive(query, key, call.score_params, temperature, num_heads)
        value = jnp.repeat(value, num_heads // value.shape[2], axis=2)  # k' has N heads
    else:
        q, k = fold_dot(call.score_name, query, key, call.score_params, temperature)
        w = None
    q = pad_axis(q, 1, tq)
    k, v = pad_axis(k, 1, ts), pad_axis(value, 1, ts)
    spec = call.mask_spec
    info, segments = mask_inputs(spec, batch, num_queries, num_keys, tq, ts)
    sparse = call.has_mods or call.block_mask is not None
    extras, treedef = Extras(segments), None
    if sparse:
        kinds = call.tile_kinds((batch, num_heads), num_queries, num_keys, blocks)
        treedef, leaves = padded_leaves(call.mod_params)
        extras = Extras(segments, *schedules(kinds, num_keys, blocks.block_k), leaves)
    config = Config(
        tile_score=tile_score,
        blocks=blocks,
        is_causal=spec.is_causal,
        window=spec.window,
        segments=segments is not None,
        interpret=interpret,
        num_warps=4 if additive or q.shape[-1] <= 64 else 8,
        score_mod=call.score_mod,
        mask_mod=call.mask_mod,
        mod_treedef=treedef,
        extent=(num_queries, num_keys),
        sparse=sparse,
    )
    out, lse = flash(config, q, k, v, w, info, extras)
    out, lse = out[:, :num_queries].astype(query.dtype), lse[:, :, :num_queries]
    out, lse = with_mod_gradients((out, lse), query, key, value, call)
    return out, None, lse


def unsupported(call: AttentionCall, name: str = "pallas") -> str | None:
    """Why the kernels cannot take this call, or ``None`` when they can (``name``: the
    implementation named in the message)."""
    if call.score_name not in TILE_SCORES:
        return (
            f"score: implementation={name!r} takes one of {list(TILE_SCORES)}, got "
            f"{'a callable' if call.score_name is None else repr(call.score_name)}; use "
            "implementation='chunked' for other scores"
        )
    if call.mask is not None:
        return (
            f"mask: implementation={name!r} takes structured masks only (is_causal, lengths, "
            "segment ids, local_window_size); use implementation='chunked' for dense masks"
        )
    if call.bias is not None:
        return f"bias: implementation={name!r} takes no bias; use implementation='chunked'"
    for mod in ("score_mod", "mask_mod"):
        try:
            if getattr(call, mod) is not None:
                check_closure(mod, getattr(call, mod), arrays=True)
        except ValueError as error:
            return f"{error} (implementation={name!r} cannot capture arrays)"
    t = as_4d(call.temperature)
    additive = call.score_hidden is not None
    if t is not None and (t.shape[3] != 1 or (additive and t.shape[2] != 1)):
        expected = "[#B, #N, 1, 1]" if additive else "[#B, #N, #T, 1]"
        return (
            f"temperature: implementation={name!r} with score={call.score_name!r} needs a "
            f"temperature broadcastable to {expected}, got shape {call.temperature.shape}"
        )
    return None


def _check_blocks(blocks, additive, dtype, num_queries, num_keys) -> BlockSizes:
    if blocks is None:
        blocks = DEFAULT_ADDITIVE_BLOCKS if additive else DEFAULT_BLOCKS[min(dtype.itemsize, 4)]
    for name in ("block_q", "block_k"):
        size = getattr(blocks, name)
        if size & (size - 1):
            raise ValueError(
                f"block_sizes.{name}: implementation='pallas' needs a power of two, got {size}"
            )
    return BlockSizes(
        min(blocks.block_q, pl.next_power_of_2(num_queries)),
        min(blocks.block_k, pl.next_power_of_2(num_keys)),
    )


def _per_head(x: Array) -> Array:
    """A parameter of shape ``()``, ``[1]`` or ``[N]`` as ``[1, 1, N or 1, 1]``."""
    return jnp.reshape(jnp.asarray(x, jnp.float32), (1, 1, -1, 1))


def fold_dot(score_name, query, key, params, temperature):
    """``(q', k')`` with ``score(q, k) / temperature == q' · k'``."""
    q, k = query.astype(jnp.float32), key.astype(jnp.float32)
    if score_name == "scaled_dot":
        q = q * _per_head(params["scale"])
    elif score_name == "cosine":
        q, k = _unit(q, 1e-6) * _per_head(params.get("scale", 1.0)), _unit(k, 1e-6)
    elif score_name == "bilinear":
        w = params["w"]
        w = jnp.broadcast_to(w.reshape(-1, *w.shape[-2:]), (q.shape[2], *w.shape[-2:]))
        q = jnp.einsum("btnh,nhg->btng", q, w.astype(jnp.float32))
    if temperature is not None:
        q = q / jnp.swapaxes(temperature, 1, 2)
    return q.astype(query.dtype), k.astype(key.dtype)


def fold_additive(query, key, params, temperature, num_heads):
    """``(q W_q + b [B, T, N, A], k W_k [B, S, N, A], v / temperature [B, N, A])``, with
    ``score(q, k) / temperature == w · act(q' + k')``: ``k'`` has one row per query head."""

    def per_head(x, trailing):
        x = jnp.asarray(x, jnp.float32)
        x = x.reshape(-1, *x.shape[x.ndim - trailing :])
        return jnp.broadcast_to(x, (num_heads, *x.shape[1:]))

    group = num_heads // key.shape[2]
    key = jnp.repeat(key.astype(jnp.float32), group, axis=2)
    q = jnp.einsum("btnh,nha->btna", query.astype(jnp.float32), per_head(params["w_q"], 2))
    if "b" in params:
        q = q + per_head(params["b"], 1)[None, None]
    k = jnp.einsum("bsnh,nha->bsna", key, per_head(params["w_k"], 2))
    w = per_head(params["v"], 1)[None] / (1.0 if temperature is None else temperature[:, :, :, 0])
    w = jnp.broadcast_to(w, (query.shape[0], num_heads, w.shape[-1]))
    return q, k, w


def mask_inputs(spec: MaskSpec, batch, num_queries, num_keys, tq, ts):
    """``info [B, 4]`` (offset, query length, key length, 0) and padded segment ids or None."""

    def length(x, full):
        return jnp.full((batch,), full) if x is None else jnp.minimum(x, full)

    info = jnp.stack(
        [
            jnp.broadcast_to(spec.offset, (batch,)),
            length(spec.q_lengths, num_queries),
            length(spec.kv_lengths, num_keys),
            jnp.zeros((batch,)),
        ],
        axis=1,
    ).astype(jnp.int32)
    if spec.q_segment_ids is None:
        return info, None
    return info, (
        pad_axis(spec.q_segment_ids.astype(jnp.int32), 1, tq),
        pad_axis(spec.kv_segment_ids.astype(jnp.int32), 1, ts),
    )
