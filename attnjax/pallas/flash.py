"""Pallas flash-attention kernels: forward, dK/dV and dQ, shared by every tile score.

Inputs are prepared (see :mod:`attnjax.pallas.attention`): ``q [B, Tp, N, D]``,
``k [B, Sp, K, D]``, ``v [B, Sp, K, Hv]`` padded to whole blocks, an optional per-head score
vector ``w [B, N, A]``, ``info [B, 4]`` = (causal offset, query length, key length, 0: four
columns as Triton blocks are powers of two) and optional segment ids. One program handles one
(batch, head, block); its loop over the other axis skips blocks that the causal/window rules or
the lengths mask entirely.

A tile score gives a tile's logits and their gradients: :class:`Dot` (``q · k``, for
dot/scaled_dot/cosine/bilinear once folded into ``q`` and ``k``) and :class:`Additive`
(``w · act(q[:, None] + k[None])``, forming ``[bq, bk, A]`` only on chip).

Score and mask mods are traced into the kernels: they see the program's batch and head
(``program_id``), the tile's absolute positions, and their parameters as refs (loaded where
indexed). With mods, each program follows a tile schedule instead of the causal/window
ranges: per row of tiles, the count of tiles to visit, then each tile's index ``j`` stored as
``j + 1`` (partial: masked) or ``-(j + 1)`` (full: no mask).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from attnjax.masks import MaskSpec
from attnjax.masks.checks import run_mod
from attnjax.pallas import triton_backend
from attnjax.softmax import online_finish, online_init, online_step, recomputed_probs
from attnjax.tiling import (
    BlockSizes,
    full_key_block_range,
    full_query_block_range,
    key_block_range,
    query_block_range,
    split_loop,
)


def dot(a: Array, b: Array, contract: tuple[int, int]) -> Array:
    """A matmul accumulating in float32, shared by the Triton and Mosaic TPU kernels. Float32
    inputs run at ``HIGHEST`` precision (Triton would use TF32 otherwise, a TPU's MXU single
    bfloat16 passes); 16-bit inputs use the native precision of the tensor cores or the MXU."""
    full = jnp.float32 in (a.dtype, b.dtype)
    return jax.lax.dot_general(
        a,
        b,
        ((contract[:1], contract[1:]), ((), ())),
        precision=jax.lax.Precision.HIGHEST if full else None,
        preferred_element_type=jnp.float32,
    )


class Dot:
    """``logits = q kᵀ``."""

    @staticmethod
    def logits(q, k, w):
        del w
        return dot(q, k, (1, 1))

    @staticmethod
    def grad_q(ds, q, k, w):
        del q, w
        return dot(ds.astype(k.dtype), k, (1, 0))

    @staticmethod
    def grad_k_w(ds, q, k, w):
        del k, w
        return dot(ds.astype(q.dtype), q, (0, 0)), None


@dataclasses.dataclass(frozen=True)
class Additive:
    """``logits[t, s] = Σ_a w[a] · act(q[t, a] + k[s, a])`` with ``act`` tanh or relu, on
    tiles ``q [bq, A]``, ``k [bk, A]`` and ``w [A]`` (Triton) or ``[1, A]`` (Mosaic TPU: 2-D
    vectors); ``[bq, bk, A]`` only on chip, in float32. Shared by both kernel families."""

    activation: str = "tanh"

    def _hidden(self, q, k):
        pre = q.astype(jnp.float32)[:, None, :] + k.astype(jnp.float32)[None, :, :]
        if self.activation == "tanh":
            h = jnp.tanh(pre)
            return h, 1.0 - h * h
        return jnp.maximum(pre, 0.0), (pre > 0).astype(jnp.float32)

    def logits(self, q, k, w):
        h, _ = self._hidden(q, k)
        return jnp.sum(h * _hidden_weights(w), axis=-1)

    def _grad_pre(self, ds, q, k, w):
        h, slope = self._hidden(q, k)
        return h, ds[:, :, None] * _hidden_weights(w) * slope

    def grad_q(self, ds, q, k, w):
        return jnp.sum(self._grad_pre(ds, q, k, w)[1], axis=1)

    def grad_k_w(self, ds, q, k, w):
        """``(dk [bk, A], dw)`` with ``dw`` shaped as ``w``."""
        h, d_pre = self._grad_pre(ds, q, k, w)
        dw = jnp.sum(jnp.sum(ds[:, :, None] * h, axis=0), axis=0, keepdims=True)
        return jnp.sum(d_pre, axis=0), dw.reshape(w.shape)


def _hidden_weights(w: Array) -> Array:
    """The score vector ``w [A]`` or ``[1, A]`` as ``[1, 1, A]`` float32."""
    return w.astype(jnp.float32).reshape(1, 1, w.shape[-1])


@dataclasses.dataclass(frozen=True)
class Config:
    """Static settings of one kernel call."""

    tile_score: Dot | Additive
    blocks: BlockSizes
    is_causal: bool
    window: tuple[int, int] | None
    segments: bool
    interpret: bool
    num_warps: int = 4
    num_stages: int = 2
    score_mod: Callable | None = None
    mask_mod: Callable | None = None
    mod_treedef: Any = None  # of the mod parameters' leaves (inputs after the schedule)
    extent: tuple[int, int] = (1, 1)  # (T, S) unpadded: the positions mods see are clamped
    sparse: bool = False  # follow the tile schedule (block mask) instead of ranges


class _Refs(NamedTuple):
    """A kernel's optional inputs (``None`` when absent) and its outputs."""

    w: Any
    q_seg: Any
    k_seg: Any
    schedule: Any
    mods: list
    outputs: list
    batch_head: tuple  # this program's (b, h), read at the kernel's top level


def _mod_args(config, refs, info, q_idx, k_idx):
    """``(b, h, q_idx, kv_idx, params)`` as mods see them in a tile ``[bq, bk]``."""
    params = kernel_params(config.mod_treedef, refs.mods)
    q_pos, k_pos = mod_positions(config.extent, info[0], q_idx[:, None], k_idx[None, :])
    return *refs.batch_head, q_pos, k_pos, params


def mod_positions(extent, offset, q_idx, k_idx):
    """The positions mods see: past the sequences (padding) clamped to their last ones
    (``extent``: the unpadded ``(T, S)``), queries shifted by the causal offset into key
    coordinates. Shared by the Triton and Mosaic TPU kernels."""
    return jnp.minimum(q_idx, extent[0] - 1) + offset, jnp.minimum(k_idx, extent[1] - 1)


def _tile_logits(config, refs, info, q, k, w, q_idx, k_idx):
    """The tile's logits after ``score_mod`` and their derivative with respect to the
    unmodified logits (``None`` without a score mod: 1)."""
    s = config.tile_score.logits(q, k, w)
    if config.score_mod is None:
        return s, None
    *args, params = _mod_args(config, refs, info, q_idx, k_idx)
    return modded_logits(config.score_mod, s, args, params)


def modded_logits(score_mod, s, args, params):
    """``(score_mod(s, *args, params), its derivative in s)`` in float32, ``args`` being
    ``(b, h, q_idx, kv_idx)``: the kernels' backward passes scale ``dS`` by the derivative."""

    def modded(x):
        return run_mod("score_mod", score_mod, (x, *args), params, KERNEL_HINT).astype(jnp.float32)

    return jax.jvp(modded, (s,), (jnp.ones_like(s),))


def mod_mask(mask_mod, args, params, shape):
    """``mask_mod(*args, params)`` broadcast to the tile's ``shape``."""
    return jnp.broadcast_to(run_mod("mask_mod", mask_mod, tuple(args), params, KERNEL_HINT), shape)


def kernel_params(treedef, refs: list, scalars: tuple[bool, ...] | None = None) -> Any:
    """The mod parameters as a kernel's mods see them: 0-d leaves loaded as scalars (they
    behave as arrays), the others refs, indexed where read (``params[name][h]``).
    ``scalars`` flags the leaves that were 0-d (the TPU kernel passes them as ``[1]``)."""
    scalars = scalars or tuple(r.ndim == 0 for r in refs)
    loaded = [r[(0,) * r.ndim] if scalar else r for r, scalar in zip(refs, scalars, strict=True)]
    return jax.tree.unflatten(treedef, loaded)


KERNEL_HINT = (
    ". Inside the Pallas kernels mods run on one tile at a time, and a mod_params leaf with "
    "dimensions is a ref: index it "
    "(params[name][h], params[name][b, idx]) instead of passing it whole to a jnp function "
    "such as jnp.take; 0-d leaves are scalars. Or use implementation='chunked'"
)


def _info(info_ref):
    """``(causal offset, query length, key length)`` as scalars (Triton cannot slice values)."""
    return info_ref[0], info_ref[1], info_ref[2]


def _mask(config, refs, masked, info, q_idx, k_idx, q_seg, k_seg):
    """The tile's mask ``[bq, bk]`` from the shared rules, lengths, segment ids and
    ``mask_mod``; ``None`` for an unmasked (fully visible) tile."""
    if not masked:
        return None
    offset, q_len, k_len = info
    spec = dataclasses.replace(
        _spec(config, offset),
        q_lengths=jnp.reshape(q_len, (1,)),
        kv_lengths=jnp.reshape(k_len, (1,)),
    )
    shape = (q_idx.shape[0], k_idx.shape[0])
    mask = jnp.broadcast_to(spec.block(q_idx, k_idx), (1, 1, *shape)).reshape(shape)
    if config.segments:
        mask = mask & (q_seg[:, None] == k_seg[None, :])
    if config.mask_mod is not None:
        *args, params = _mod_args(config, refs, info, q_idx, k_idx)
        mask = mask & mod_mask(config.mask_mod, args, params, shape)
    return mask


def _spec(config, offset):
    """The causal/window rules (they bound the blocks a program visits)."""
    return MaskSpec(is_causal=config.is_causal, window=config.window, offset=offset)


def _refs(config, refs, count):
    """Split a kernel's refs: the ``count`` fixed inputs and the :class:`_Refs`."""
    refs = list(refs)
    head, rest = refs[:count], refs[count:]
    w = rest.pop(0) if isinstance(config.tile_score, Additive) else None
    segs = (rest.pop(0), rest.pop(0)) if config.segments else (None, None)
    schedule = rest.pop(0) if config.sparse else None
    num_mods = 0 if config.mod_treedef is None else config.mod_treedef.num_leaves
    mods, outputs = rest[:num_mods], rest[num_mods:]
    batch_head = (pl.program_id(0), pl.program_id(1))
    return head, _Refs(w, *segs, schedule, mods, outputs, batch_head)


def _loop(config, refs, ranges, body, carry):
    """Run ``body(masked)(j, carry)`` over the row's tiles: the schedule when sparse, else the
    ranges ``(lo, full_lo, full_hi, hi)`` of :func:`split_loop`."""
    if not config.sparse:
        return split_loop(*ranges(), body, carry)
    schedule = refs.schedule

    def step(n, carry):
        entry = schedule[n + 1]
        j = jnp.abs(entry) - 1
        return jax.lax.cond(
            entry < 0, lambda c: body(False)(j, c), lambda c: body(True)(j, c), carry
        )

    return jax.lax.fori_loop(0, schedule[0], step, carry)


def _num_blocks(length, block: int):
    """``ceil(length / block)`` in ``length``'s int dtype (``jax_enable_x64`` would make the
    Python int an int64)."""
    return pl.cdiv(length, jnp.asarray(block, length.dtype))


def key_blocks(config, info, q_start, num_k_blocks):
    """``(lo, full_lo, full_hi, hi)``: the key blocks a query block visits; those in
    ``[full_lo, full_hi)`` need no mask (rows past the query length are fixed separately)."""
    bq, bk = config.blocks.block_q, config.blocks.block_k
    spec = _spec(config, info[0])
    lo, hi = key_block_range(spec, q_start, bq, bk, num_k_blocks)
    hi = jnp.minimum(hi, _num_blocks(info[2], bk))
    if config.segments:
        return lo, hi, hi, hi
    full_lo, full_hi = full_key_block_range(spec, q_start, bq, bk, lo, hi)
    return lo, full_lo, jnp.maximum(full_lo, jnp.minimum(full_hi, info[2] // bk)), hi


def query_blocks(config, info, k_start, num_q_blocks):
    """``(lo, full_lo, full_hi, hi)``: the query blocks that see a key block, as above."""
    bq, bk = config.blocks.block_q, config.blocks.block_k
    spec = _spec(config, info[0])
    lo, hi = query_block_range(spec, k_start, bq, bk, num_q_blocks)
    hi = jnp.minimum(hi, _num_blocks(info[1], bq))
    if config.segments:
        return lo, hi, hi, hi
    full_lo, full_hi = full_query_block_range(spec, k_start, bq, bk, lo, hi)
    partial = k_start + bk > info[2]  # keys past the key length: mask every tile
    return lo, jnp.where(partial, hi, full_lo), jnp.where(partial, hi, full_hi), hi


def _forward_kernel(config, *refs):
    (q_ref, k_ref, v_ref, info_ref), r = _refs(config, refs, 4)
    o_ref, lse_ref = r.outputs
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_start = pl.program_id(2) * bq
    info = _info(info_ref)
    q, w = q_ref[...], None if r.w is None else r.w[...]
    q_idx = q_start + jnp.arange(bq)
    q_seg = None if r.q_seg is None else r.q_seg[...]

    def body(masked):
        def step(j, carry):
            keys = pl.ds(j * bk, bk)
            k_idx = j * bk + jnp.arange(bk)
            k_seg = None if r.k_seg is None else r.k_seg[keys]
            s, _ = _tile_logits(config, r, info, q, k_ref[keys, :], w, q_idx, k_idx)
            mask = _mask(config, r, masked, info, q_idx, k_idx, q_seg, k_seg)
            return online_step(
                carry,
                s,
                mask,
                lambda p: dot(p.astype(v_ref.dtype), v_ref[keys, :], (1, 0)),
            )

        return step

    num_k_blocks = k_ref.shape[0] // bk
    ranges = functools.partial(key_blocks, config, info, q_start, num_k_blocks)
    init = online_init((bq,), v_ref.shape[-1])
    out, lse = online_finish(_loop(config, r, ranges, body, init))
    valid = q_idx < info[1]  # unmasked tiles also fill rows past the query length
    o_ref[...] = jnp.where(valid[:, None], out, 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(valid, lse, -jnp.inf)


def _dkv_kernel(config, *refs):
    (q_ref, k_ref, v_ref, info_ref, do_ref, lse_ref, delta_ref), r = _refs(config, refs, 7)
    dk_ref, dv_ref, *dw_ref = r.outputs
    bq, bk = config.blocks.block_q, config.blocks.block_k
    k_start = pl.program_id(2) * bk
    info = _info(info_ref)
    k, v, w = k_ref[...], v_ref[...], None if r.w is None else r.w[...]
    k_idx = k_start + jnp.arange(bk)
    k_seg = None if r.k_seg is None else r.k_seg[...]

    def body(masked):
        def step(i, carry):
            dk, dv, dw = carry
            rows = pl.ds(i * bq, bq)
            q_idx = i * bq + jnp.arange(bq)
            q, do = q_ref[rows, :], do_ref[rows, :]
            q_seg = None if r.q_seg is None else r.q_seg[rows]
            mask = _mask(config, r, masked, info, q_idx, k_idx, q_seg, k_seg)
            s, slope = _tile_logits(config, r, info, q, k, w, q_idx, k_idx)
            p = recomputed_probs(s, lse_ref[rows], mask)
            dv = dv + dot(p.astype(do.dtype), do, (0, 0))
            ds = p * (dot(do, v, (1, 1)) - delta_ref[rows][:, None])
            ds = ds if slope is None else ds * slope
            dk_t, dw_t = config.tile_score.grad_k_w(ds, q, k, w)
            return dk + dk_t, dv, None if dw is None else dw + dw_t

        return step

    num_q_blocks = q_ref.shape[0] // bq
    ranges = functools.partial(query_blocks, config, info, k_start, num_q_blocks)
    dw = None if r.w is None else jnp.zeros(w.shape, jnp.float32)
    init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32), dw)
    dk, dv, dw = _loop(config, r, ranges, body, init)
    dk_ref[...] = dk
    dv_ref[...] = dv
    if dw_ref:
        dw_ref[0][...] = dw


def _dq_kernel(config, *refs):
    (q_ref, k_ref, v_ref, info_ref, do_ref, lse_ref, delta_ref), r = _refs(config, refs, 7)
    (dq_ref,) = r.outputs
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_start = pl.program_id(2) * bq
    info = _info(info_ref)
    q, w = q_ref[...], None if r.w is None else r.w[...]
    do, lse, delta = do_ref[...], lse_ref[...], delta_ref[...]
    q_idx = q_start + jnp.arange(bq)
    q_seg = None if r.q_seg is None else r.q_seg[...]

    def body(masked):
        def step(j, dq):
            keys = pl.ds(j * bk, bk)
            k_idx = j * bk + jnp.arange(bk)
            k = k_ref[keys, :]
            k_seg = None if r.k_seg is None else r.k_seg[keys]
            mask = _mask(config, r, masked, info, q_idx, k_idx, q_seg, k_seg)
            s, slope = _tile_logits(config, r, info, q, k, w, q_idx, k_idx)
            p = recomputed_probs(s, lse, mask)
            ds = p * (dot(do, v_ref[keys, :], (1, 1)) - delta[:, None])
            ds = ds if slope is None else ds * slope
            return dq + config.tile_score.grad_q(ds, q, k, w)

        return step

    num_k_blocks = k_ref.shape[0] // bk
    ranges = functools.partial(key_blocks, config, info, q_start, num_k_blocks)
    dq_ref[...] = _loop(config, r, ranges, body, jnp.zeros(q.shape, jnp.float32))


def _specs(config, shapes, program_axis):
    """BlockSpecs of q, k, v, info (+ do, lse, delta) (+ w) (+ segment ids) for a grid
    ``(B, N, blocks)`` that tiles the query (``program_axis="q"``) or key axis."""
    (_, tq, num_heads, d), (_, ts, num_kv, _), hv = shapes
    group = num_heads // num_kv
    bq = config.blocks.block_q if program_axis == "q" else tq
    bk = config.blocks.block_k if program_axis == "k" else ts
    q_at = (lambda b, n, i: (b, i, n, 0)) if program_axis == "q" else (lambda b, n, i: (b, 0, n, 0))
    k_at = (
        (lambda b, n, i: (b, i, n // group, 0))
        if program_axis == "k"
        else (lambda b, n, i: (b, 0, n // group, 0))
    )
    row_at = (lambda b, n, i: (b, n, i)) if program_axis == "q" else (lambda b, n, i: (b, n, 0))
    return {
        "q": pl.BlockSpec((None, bq, None, d), q_at),
        "k": pl.BlockSpec((None, bk, None, d), k_at),
        "v": pl.BlockSpec((None, bk, None, hv), k_at),
        "do": pl.BlockSpec((None, bq, None, hv), q_at),
        "row": pl.BlockSpec((None, None, bq), row_at),
        "info": pl.BlockSpec((None, 4), lambda b, n, i: (b, 0)),
        "q_seg": pl.BlockSpec((None, bq), lambda b, n, i: (b, i if program_axis == "q" else 0)),
        "k_seg": pl.BlockSpec((None, bk), lambda b, n, i: (b, i if program_axis == "k" else 0)),
    }


class Extras(NamedTuple):
    """Optional kernel inputs beyond the score vector: segment ids ``([B, Tp], [B, Sp])``,
    the tile schedules per query block ``[B', N', Tq, P]`` and per key block
    ``[B', N', Sk, P]`` (``B'``, ``N'`` 1 or full), and the mod parameters' leaves."""

    segments: tuple[Array, Array] | None = None
    rows: Array | None = None
    cols: Array | None = None
    mods: tuple[Array, ...] = ()


def _extras(config, specs, w, extras, program_axis):
    """The optional inputs (score vector, segment ids, schedule, mod parameters) and their
    specs, in the order :func:`_refs` reads them."""
    arrays, in_specs = [], []
    if w is not None:
        arrays.append(w)
        in_specs.append(pl.BlockSpec((None, None, w.shape[-1]), lambda b, n, i: (b, n, 0)))
    if config.segments:
        arrays += list(extras.segments)
        in_specs += [specs["q_seg"], specs["k_seg"]]
    if config.sparse:
        schedule = extras.rows if program_axis == "q" else extras.cols
        per_b, per_n = schedule.shape[0] > 1, schedule.shape[1] > 1
        arrays.append(schedule)
        in_specs.append(
            pl.BlockSpec(
                (None, None, None, schedule.shape[-1]),
                lambda b, n, i: (b if per_b else 0, n if per_n else 0, i, 0),
            )
        )
    for leaf in extras.mods:
        arrays.append(leaf)
        in_specs.append(pl.BlockSpec(leaf.shape, lambda b, n, i, nd=leaf.ndim: (0,) * nd))
    return arrays, in_specs


def _call(config, kernel, grid, in_specs, out_specs, out_shape, *args):
    call = pl.pallas_call(
        functools.partial(kernel, config),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=config.interpret,
        compiler_params=triton_backend.compiler_params(config.num_warps, config.num_stages),
        name=f"attnjax_{kernel.__name__.strip('_')}",
    )
    with triton_backend.quiet():  # eager calls lower here (under jit: where jit lowers)
        return call(*args)


def _forward(config, q, k, v, w, info, extras):
    batch, tq, num_heads, _ = q.shape
    hv = v.shape[-1]
    specs = _specs(config, (q.shape, k.shape, hv), "q")
    extras, extra_specs = _extras(config, specs, w, extras, "q")
    return _call(
        config,
        _forward_kernel,
        (batch, num_heads, tq // config.blocks.block_q),
        [specs["q"], specs["k"], specs["v"], specs["info"], *extra_specs],
        [specs["do"], specs["row"]],
        [
            jax.ShapeDtypeStruct((batch, tq, num_heads, hv), v.dtype),
            jax.ShapeDtypeStruct((batch, num_heads, tq), jnp.float32),
        ],
        q,
        k,
        v,
        info,
        *extras,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def flash(
    config: Config,
    q: Float[Array, "B Tp N D"],
    k: Float[Array, "B Sp K D"],
    v: Float[Array, "B Sp K Hv"],
    w: Float[Array, "B N A"] | None,
    info: Int[Array, "B 4"],
    extras: Extras,
) -> tuple[Float[Array, "B Tp N Hv"], Float[Array, "B N Tp"]]:
    """``(output, lse)`` of the prepared inputs, differentiable in ``q``, ``k``, ``v``, ``w``
    (mod parameters get their gradients elsewhere: see :mod:`attnjax.pallas.attention`)."""
    return _forward(config, q, k, v, w, info, extras)


def _flash_fwd(config, q, k, v, w, info, extras):
    out, lse = _forward(config, q, k, v, w, info, extras)
    return (out, lse), (q, k, v, w, info, extras, out, lse)


def _flash_bwd(config, residuals, cotangents):
    q, k, v, w, info, extras, out, lse = residuals
    d_out, d_lse = cotangents
    batch, tq, num_heads, d = q.shape
    ts, num_kv, hv = k.shape[1], k.shape[2], v.shape[-1]
    bq, bk = config.blocks.block_q, config.blocks.block_k
    delta = jnp.einsum("btnh,btnh->bnt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    delta = delta - d_lse
    args = (q, k, v, info, d_out, lse, delta)

    specs = _specs(config, (q.shape, k.shape, hv), "k")
    key_extras, extra_specs = _extras(config, specs, w, extras, "k")
    in_specs = [specs[n] for n in ("q", "k", "v", "info", "do", "row", "row")] + extra_specs
    per_head = lambda b, n, i: (b, i, n, 0)  # noqa: E731
    out_specs = [
        pl.BlockSpec((None, bk, None, d), per_head),
        pl.BlockSpec((None, bk, None, hv), per_head),
    ]
    out_shape = [
        jax.ShapeDtypeStruct((batch, ts, num_heads, d), jnp.float32),
        jax.ShapeDtypeStruct((batch, ts, num_heads, hv), jnp.float32),
    ]
    if w is not None:
        a_dim = w.shape[-1]
        out_specs.append(pl.BlockSpec((None, None, None, a_dim), lambda b, n, i: (b, n, i, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, num_heads, ts // bk, a_dim), jnp.float32))
    dk, dv, *dw = _call(
        config,
        _dkv_kernel,
        (batch, num_heads, ts // bk),
        in_specs,
        out_specs,
        out_shape,
        *args,
        *key_extras,
    )
    group_sum = lambda x: x.reshape(batch, ts, num_kv, -1, x.shape[-1]).sum(axis=3)  # noqa: E731

    specs = _specs(config, (q.shape, k.shape, hv), "q")
    query_extras, extra_specs = _extras(config, specs, w, extras, "q")
    in_specs = [specs[n] for n in ("q", "k", "v", "info", "do", "row", "row")] + extra_specs
    dq = _call(
        config,
        _dq_kernel,
        (batch, num_heads, tq // bq),
        in_specs,
        specs["q"],
        jax.ShapeDtypeStruct(q.shape, jnp.float32),
        *args,
        *query_extras,
    )
    dw = None if w is None else dw[0].sum(axis=2).astype(w.dtype)
    return (
        dq.astype(q.dtype),
        group_sum(dk).astype(k.dtype),
        group_sum(dv).astype(v.dtype),
        dw,
        None,
        None,
    )


flash.defvjp(_flash_fwd, _flash_bwd)
