"""Score and mask mods on the Pallas path.

- Tile schedules: the tile kinds (:meth:`attnjax.call.AttentionCall.tile_kinds`) become, per
  row of tiles, the count of tiles to visit and their indices (see :mod:`attnjax.pallas.flash`).
- Parameters: each leaf of ``mod_params`` is a whole-array kernel input, padded to powers of
  two (Triton's blocks) by repeating its last entries, so clamped indices read the same values.
- Gradients of float ``mod_params``: the kernels do not form them; an identity on the
  outputs whose VJP also runs the chunked path's supplies them (one extra chunked pass, in the
  backward pass only).
- :func:`lowering_error`: whether a mod lowers to a Triton kernel, checked before use on GPU.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton
from jaxtyping import Array, Int

from attnjax.call import AttentionCall, merge_floats, split_floats
from attnjax.chunked import chunked_attention
from attnjax.masks import EMPTY, FULL, PARTIAL, TileKinds
from attnjax.pallas.flash import kernel_params
from attnjax.tiling import pad_axis


def schedules(kinds: TileKinds, num_keys: int, block_k: int) -> tuple[Array, Array]:
    """``(rows, cols)``: the schedule per query block ``[B', N', Tq, P]`` and per key block
    ``[B', N', Sk, P]``. A last key tile that holds padding is never full (it is masked)."""
    if num_keys % block_k:
        kinds = kinds.at[..., -1].min(PARTIAL)
    return _schedule(kinds), _schedule(jnp.swapaxes(kinds, 2, 3))


def _schedule(kinds: TileKinds) -> Int[Array, "B N R P"]:
    """Per row: the count of tiles to visit, then ``j + 1`` (partial) or ``-(j + 1)``
    (full) for each, padded with zeros to a power of two."""
    visit = kinds > EMPTY
    order = jnp.argsort((~visit).astype(jnp.int8), axis=-1, stable=True)
    sorted_kinds = jnp.take_along_axis(kinds, order, axis=-1)
    entry = jnp.where(sorted_kinds == FULL, -(order + 1), order + 1)
    entry = jnp.where(sorted_kinds > EMPTY, entry, 0)
    count = jnp.sum(visit, axis=-1, keepdims=True)
    schedule = jnp.concatenate([count, entry], axis=-1).astype(jnp.int32)
    return pad_axis(schedule, 3, pl.next_power_of_2(schedule.shape[-1]))


def padded_leaves(mod_params: Any) -> tuple[Any, tuple[Array, ...]]:
    """``(treedef, leaves)`` with every leaf padded to powers of two (edge values)."""
    leaves, treedef = jax.tree.flatten(mod_params)
    padded = []
    for leaf in leaves:
        widths = [(0, pl.next_power_of_2(n) - n) for n in leaf.shape]
        padded.append(jnp.pad(leaf, widths, mode="edge") if leaf.ndim and leaf.size else leaf)
    return treedef, tuple(padded)


def with_mod_gradients(outputs, query, key, value, call: AttentionCall):
    """``outputs`` (output, lse) unchanged, with a VJP that also gives the float
    ``mod_params`` their gradient through :func:`attnjax.chunked.chunked_attention`."""
    floats, data = split_floats(call.mod_params)
    if not jax.tree.leaves(floats):
        return outputs
    rest = dataclasses.replace(call, mod_params=data)
    return _with_mod_vjp(outputs, floats, query, key, value, rest)


@jax.custom_vjp
def _with_mod_vjp(outputs, floats, query, key, value, call):
    return outputs


def _mod_vjp_fwd(outputs, floats, query, key, value, call):
    return outputs, (floats, query, key, value, call)


def _mod_vjp_bwd(residuals, cotangents):
    """The outputs' cotangents pass through; the mod parameters' come from the chunked path
    (the outputs carry any batching, so under ``vmap`` each example gets its own)."""
    floats, query, key, value, call = residuals

    def attention(f):
        params = merge_floats(f, call.mod_params)
        out, _, lse = chunked_attention(
            query, key, value, dataclasses.replace(call, mod_params=params)
        )
        return out, lse

    d_out, d_lse = cotangents
    finite = jnp.isfinite(d_lse)
    (d_floats,) = jax.vjp(attention, floats)[1]((d_out, jnp.where(finite, d_lse, 0.0)))
    return cotangents, d_floats, None, None, None, None


_with_mod_vjp.defvjp(_mod_vjp_fwd, _mod_vjp_bwd)


def lowering_error(call: AttentionCall) -> str | None:
    """``None`` if the call's mods lower into a Triton kernel (checked with
    ``jax.export(..., platforms=["cuda"])``, no GPU needed), else a message naming the mod."""
    treedef, leaves = padded_leaves(call.mod_params)
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves)
    for name in ("score_mod", "mask_mod"):
        mod = getattr(call, name)
        error = None if mod is None else _lowering_error(name, mod, treedef, shapes)
        if error is not None:
            return (
                f"{name}: {getattr(mod, '__qualname__', mod)!r} does not lower into the Pallas "
                f"(Triton) kernel ({error}); use implementation='chunked'"
            )
    return None


@functools.cache
def _lowering_error(name, mod, treedef, shapes) -> str | None:
    """Lower a one-tile kernel that applies ``mod`` for CUDA; the error's first line or None."""
    tile = 16

    def kernel(*refs):
        *param_refs, out_ref = refs
        params = kernel_params(treedef, param_refs)
        idx = jnp.arange(tile, dtype=jnp.int32)
        args = (pl.program_id(0), pl.program_id(1), idx[:, None], idx[None, :], params)
        logits = jnp.ones((tile, tile), jnp.float32)
        if name == "score_mod":
            out_ref[...] = mod(logits, *args).astype(jnp.float32)
        else:
            out_ref[...] = jnp.where(jnp.broadcast_to(mod(*args), logits.shape), logits, 0.0)

    def apply(*leaves):
        return pl.pallas_call(
            kernel,
            grid=(1, 1),
            in_specs=[pl.BlockSpec(x.shape, lambda b, h, nd=x.ndim: (0,) * nd) for x in leaves],
            out_specs=pl.BlockSpec((tile, tile), lambda b, h: (0, 0)),
            out_shape=jax.ShapeDtypeStruct((tile, tile), jnp.float32),
            compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=1),
        )(*leaves)

    try:
        jax.export.export(
            jax.jit(apply),
            platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*shapes)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None
