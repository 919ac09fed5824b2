"""Score and mask mods on the Pallas path.

- Tile schedules: the tile kinds (:meth:`attnjax.call.AttentionCall.tile_kinds`) become, per
  row of tiles, the count of tiles to visit and their indices (see :mod:`attnjax.pallas.flash`).
- Parameters: each leaf of ``mod_params`` is a whole-array kernel input, padded to powers of
  two (Triton's blocks) by repeating its last entries, so clamped indices read the same values.
- Gradients of float ``mod_params``: the kernels do not form them; an identity on the
  outputs whose VJP also runs the chunked path's supplies them (one extra chunked pass, in the
  backward pass only).
- :func:`lowering_error`: whether a mod lowers to a Triton kernel, checked before use on GPU,
  or to a Mosaic TPU kernel (parameters in SMEM, :class:`SmemParam`: reads at vector indices
  as :func:`select_gather`), checked before the TPU kernel is lowered (once per mod, platform,
  parameter shapes and dtypes: answers are cached).
"""

import collections
import contextlib
import dataclasses
import functools
import inspect
import threading
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Int

from attnjax.call import AttentionCall, merge_floats, split_floats
from attnjax.chunked import chunked_attention
from attnjax.masks import EMPTY, FULL, PARTIAL, TileKinds
from attnjax.pallas import triton_backend
from attnjax.pallas.flash import kernel_params, mod_mask, modded_logits
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


class SmemParam:
    """A mod parameter's SMEM ref (Mosaic TPU kernel) as mods index it: at scalar indices
    (``params[name][h]``, ``[b]``) a scalar load; at vector indices (a table at a tile of
    buckets, ids at a tile of positions) :func:`select_gather`, which Mosaic lowers (it has no
    gather from SMEM). Every axis takes an index: no slices beside vector indices."""

    def __init__(self, ref):
        self.ref = ref
        self.shape, self.ndim, self.dtype = ref.shape, len(ref.shape), ref.dtype

    def __getitem__(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if all(p is Ellipsis or isinstance(p, slice) or jnp.ndim(p) == 0 for p in parts):
            return self.ref[index]
        if len(parts) != self.ndim or any(p is Ellipsis or isinstance(p, slice) for p in parts):
            raise NotImplementedError(
                "the Mosaic TPU kernel reads a mod parameter at vector indices only with an "
                f"index per axis (params[name][h, bucket]); got {len(parts)} indices, slices "
                f"or ... for a leaf of shape {self.shape}"
            )
        return select_gather(self.ref, parts)


def select_gather(ref, parts: tuple) -> Array:
    """``ref[parts]``, some parts vectors of indices (``[bq, bk]``, broadcastable), the others
    scalars, as a select-accumulate: for each entry of the box the tile's indices span (per
    vector axis, their min to max), one scalar SMEM load and a vector select where the
    indices point at it. Indices are normalized as jnp's (negative from the end, clamped).

    Cost per tile: one compare-select over the indices' shape on the VPU per entry of the box
    (a table of ``L`` buckets: at most ``L``; ids read at ``q_idx`` or ``kv_idx``: about ``bq``
    or ``bk`` entries, whatever the sequence length)."""
    axes = [axis for axis, p in enumerate(parts) if jnp.ndim(p) > 0]
    shape = jnp.broadcast_shapes(*(jnp.shape(parts[axis]) for axis in axes))
    indices = {}
    for axis in axes:
        size = ref.shape[axis]
        index = jnp.asarray(parts[axis], jnp.int32)
        indices[axis] = jnp.clip(jnp.where(index < 0, index + size, index), 0, size - 1)
    lows = {axis: jnp.min(index) for axis, index in indices.items()}
    spans = {axis: jnp.max(index) - lows[axis] + 1 for axis, index in indices.items()}

    def select(flat, gathered):
        at, hit = list(parts), jnp.ones(shape, jnp.bool_)
        for axis in reversed(axes):  # the flat entry in the box, last axis fastest
            flat, offset = jnp.divmod(flat, spans[axis])
            at[axis] = lows[axis] + offset
            hit = hit & (indices[axis] == at[axis])
        return jnp.where(hit, ref[tuple(at)], gathered)

    count = functools.reduce(jnp.multiply, spans.values())
    return jax.lax.fori_loop(0, count, select, jnp.zeros(shape, ref.dtype))


# A GPU to lower for where none is attached (Triton's lowering reads the compute capability).
ABSTRACT_GPU = "NVIDIA H100"
# A TPU to lower for where none is attached (Mosaic's lowering reads the chip generation).
ABSTRACT_TPU = "TPU v5 lite"
# How many lowering checks to remember (mod, name, parameter shapes and dtypes each).
LOWERING_CACHE_SIZE = 1024
_lowering_cache: collections.OrderedDict = collections.OrderedDict()
_lowering_lock = threading.Lock()


def lowering_error(call: AttentionCall, platform: str = "cuda") -> str | None:
    """``None`` if the call's mods lower into a Triton kernel (``platform="cuda"``) or a Mosaic
    TPU kernel (``"tpu"``), checked with ``jax.export(..., platforms=[platform])`` (no GPU or
    TPU needed), else a message naming the mod.

    Each answer is cached, keyed on the mod (its code, defaults and closed-over values when
    they are hashable, so a mod rebuilt per step hits the cache; else the mod object itself)
    and the padded shapes and dtypes of ``mod_params``: a check exports once, not per call.
    """
    missing = triton_backend.missing() if platform == "cuda" else None
    if missing is not None:
        return missing
    leaves, treedef = jax.tree.flatten(call.mod_params)
    shape = _padded_shape if platform == "cuda" else tuple
    shapes = tuple(jax.ShapeDtypeStruct(shape(jnp.shape(x)), x.dtype) for x in leaves)
    kernel = "Pallas (Triton)" if platform == "cuda" else "Mosaic TPU"
    for name in ("score_mod", "mask_mod"):
        mod = getattr(call, name)
        error = (
            None if mod is None else _cached_lowering_error(platform, name, mod, treedef, shapes)
        )
        if error is not None:
            return (
                f"{name}: {getattr(mod, '__qualname__', mod)!r} does not lower into the "
                f"{kernel} kernel ({error}); use implementation='chunked'"
            )
    return None


def _padded_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape :func:`padded_leaves` gives a leaf of ``shape``."""
    if not shape or not all(shape):
        return tuple(shape)
    return tuple(pl.next_power_of_2(n) for n in shape)


class _Unhashable(Exception):
    pass


def mod_signature(mod: Any, depth: int = 0) -> Any:
    """A hashable key equal for mods that trace alike: a function's code, defaults and
    closed-over values (functions and ``functools.partial`` recursively); raises
    ``_Unhashable`` when a value is not hashable (an array, say)."""
    if depth > 8:
        raise _Unhashable
    if isinstance(mod, functools.partial):
        keywords = tuple(sorted((k, _value_key(v, depth)) for k, v in mod.keywords.items()))
        args = tuple(_value_key(a, depth) for a in mod.args)
        return ("partial", mod_signature(mod.func, depth + 1), args, keywords)
    if inspect.ismethod(mod):
        return ("method", _value_key(mod.__self__, depth, callables=False), mod.__func__)
    code = getattr(mod, "__code__", None)
    wrapped = getattr(mod, "__wrapped__", None)
    if code is not None and wrapped is not None and _is_type_checker(code):
        # jaxtyping/beartype run-time checks (a new wrapper per decorated closure) do not
        # change what the mod lowers to: the wrapped function decides.
        return ("checked", code, mod_signature(wrapped, depth + 1))
    if code is None:
        return ("object", _value_key(mod, depth, callables=False))
    try:
        cells = tuple(_value_key(c.cell_contents, depth) for c in mod.__closure__ or ())
    except ValueError as error:  # an empty cell
        raise _Unhashable from error
    kwdefaults = tuple(sorted((mod.__kwdefaults__ or {}).items()))
    return (
        "function",
        code,
        _value_key(mod.__defaults__, depth),
        _value_key(kwdefaults, depth),
        cells,
    )


def _is_type_checker(code) -> bool:
    filename = code.co_filename.replace("\\", "/")
    return "/jaxtyping/" in filename or "/beartype/" in filename or "beartype" in filename[:12]


def _value_key(value: Any, depth: int, callables: bool = True) -> Any:
    if isinstance(value, tuple):
        return tuple(_value_key(v, depth) for v in value)
    if callables and callable(value) and not isinstance(value, type):
        return mod_signature(value, depth + 1)
    try:
        hash(value)
    except TypeError as error:
        raise _Unhashable from error
    return (type(value), value)


def _cached_lowering_error(platform, name, mod, treedef, shapes) -> str | None:
    try:
        key = (platform, name, mod_signature(mod), treedef, shapes)
        hash(key)
    except (_Unhashable, TypeError):
        key = (platform, name, id(mod), treedef, shapes)
        hold = mod  # keep the object alive so its id is not reused while cached
    else:
        hold = None
    with _lowering_lock:
        if key in _lowering_cache:
            _lowering_cache.move_to_end(key)
            return _lowering_cache[key][0]
    lower = _lowering_error if platform == "cuda" else _tpu_lowering_error
    error = lower(name, mod, treedef, shapes)
    with _lowering_lock:
        _lowering_cache[key] = (error, hold)
        while len(_lowering_cache) > LOWERING_CACHE_SIZE:
            _lowering_cache.popitem(last=False)
    return error


def _lowering_error(name, mod, treedef, shapes) -> str | None:
    """Lower a one-tile kernel that applies ``mod`` for CUDA; the error's first line or None.
    Without a GPU attached, it lowers for an abstract one (:data:`ABSTRACT_GPU`)."""
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
            compiler_params=triton_backend.compiler_params(num_warps=4, num_stages=1),
        )(*leaves)

    try:
        with triton_backend.quiet(), _target("cuda", ABSTRACT_GPU):
            jax.export.export(
                jax.jit(apply),
                platforms=["cuda"],
                disabled_checks=[
                    jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
                ],
            )(*shapes)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None


def _tpu_lowering_error(name, mod, treedef, shapes) -> str | None:
    """Lower a one-tile Mosaic kernel that applies ``mod`` (its derivative too, for a score
    mod) to a ``[16, 128]`` tile of 2-D iotas, with parameters in SMEM as the TPU kernel
    passes them (0-d leaves as ``[1]``); the error's first line or None."""
    tile = (16, 128)
    scalars = tuple(x.ndim == 0 for x in shapes)

    def kernel(*refs):
        *param_refs, out_ref = refs
        params = kernel_params(treedef, [SmemParam(r) for r in param_refs], scalars)
        q_idx, k_idx = (jax.lax.broadcasted_iota(jnp.int32, tile, axis) for axis in (0, 1))
        args = (pl.program_id(0), pl.program_id(1), q_idx, k_idx)
        logits = jnp.ones(tile, jnp.float32)
        if name == "score_mod":
            modded, slope = modded_logits(mod, logits, args, params)
            out_ref[...] = modded * slope
        else:
            out_ref[...] = jnp.where(mod_mask(mod, args, params, tile), logits, 0.0)

    def apply(*leaves):
        return pl.pallas_call(
            kernel,
            grid=(1, 1),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)] * len(leaves),
            out_specs=pl.BlockSpec(tile, lambda b, h: (0, 0)),
            out_shape=jax.ShapeDtypeStruct(tile, jnp.float32),
            interpret=False,
        )(*leaves)

    inputs = [jax.ShapeDtypeStruct(x.shape or (1,), x.dtype) for x in shapes]
    try:
        with pltpu.force_tpu_interpret_mode(None), _target("tpu", ABSTRACT_TPU):
            jax.export.export(jax.jit(apply), platforms=["tpu"])(*inputs)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None


def _target(platform: str, kind: str):
    """An abstract device of ``kind`` to lower for (``jax.sharding.AbstractDevice``), unless
    the default backend is that platform."""
    if jax.default_backend() == {"cuda": "gpu"}.get(platform, platform):
        return contextlib.nullcontext()
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=None, platform=platform)
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=device))
