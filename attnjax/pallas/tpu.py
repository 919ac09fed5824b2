"""``implementation="pallas_tpu"``: a Mosaic TPU flash kernel (forward, dK/dV and dQ).

It shares the Triton path's preparation (:mod:`attnjax.pallas.attention`: dot-family scores
and the temperature folded into ``q'`` and ``k'``, additive scores into ``q' = q W_q + b``,
``k' = k W_k`` and ``w = v / temperature``, the per-batch ``info`` row of causal offset and
lengths), its tile scores (:class:`attnjax.pallas.flash.Additive`: a tile's logits and their
gradients, ``[bq, bk, A]`` only on chip) and its tile ranges
(:func:`attnjax.pallas.flash.key_blocks` and ``query_blocks``: the causal/window bounds of
:class:`attnjax.masks.MaskSpec` and the lengths). What is TPU-shaped:

- Layout ``[B, N, T, D]``: the last two dimensions of a block must be multiples of the
  (8, 128) float32 / (16, 128) bfloat16 tile, so heads move out of them. Head dimensions are
  padded with zeros to 128 lanes (no change to any logit), sequences to whole blocks.
- The loop over the other sequence is the innermost grid axis ("arbitrary"), so Pallas
  pipelines its DMAs; running max, sum and accumulators live in VMEM scratch, row statistics
  replicated over 128 lanes as in JAX's TPU kernel. Offset and lengths are scalar-prefetched:
  the index maps clamp a skipped block to a visited one, so a skipped tile costs neither
  compute nor DMA. Tile masks use 2-D iotas (Mosaic's vectors are 2-D).
- GQA: K/V index maps read head ``n // G``; the dK/dV grid runs over K/V heads and sums the
  ``G`` query heads of its group in VMEM (no repeat in HBM, no per-query-head dK). Additive
  scores have one ``k'`` per query head, so V is repeated to ``N`` heads (as for Triton).
- Additive: the hidden size ``A`` is padded with zeros to 128 lanes (a padded unit adds
  ``w · act(0) = 0``), ``w`` travels as ``[B, N, 1, A]``; 16 x 128 tiles by default keep the
  float32 ``[bq, bk, A]`` array at 1 MiB of VMEM for ``A <= 128``. Each dK/dV program writes
  its key block's share of ``dw`` (summed outside: the key-block axis is parallel).
- float32 or bfloat16 inputs (float16 and float64 are refused: Mosaic's support for them
  depends on the chip). Matmuls accumulate in float32 (``preferred_element_type``), softmax
  in float32. Float32 matmuls run at ``HIGHEST`` precision, while JAX's TPU flash and splash
  kernels leave the default (which may be single bfloat16 passes on the MXU): the same
  shared :func:`~attnjax.pallas.flash.dot` as the Triton kernel, so float32 results hold the
  float32 parity tolerances against the dense path, as on every other implementation. The
  float32 rows of ``benchmarks/tpu.sh`` therefore time a more precise kernel than JAX's.

The platform the call is lowered for picks the Mosaic kernel (TPU) or Pallas' interpreter
(CPU and other non-GPU platforms: slow, for tests), so ``jax.export(..., platforms=["tpu"])``
on a CPU holds the Mosaic kernel. On a GPU the call is refused (:func:`platform_interpret`):
the interpreter there would be orders of magnitude slower than ``"pallas"`` or ``"chunked"``.
The CPU tests run JAX's TPU interpret mode instead (``pltpu.force_tpu_interpret_mode``: simulated
HBM, VMEM and DMAs, race detection). Callable scores, dense masks and bias are refused
(:func:`unsupported`): use ``"chunked"``.

Score and mask mods are traced into all three kernels with the Triton path's pieces
(:func:`~attnjax.pallas.flash.mod_positions`, ``modded_logits``, ``mod_mask``,
``kernel_params``): ``b`` and ``h`` are the program's batch (modulo the batch before ``vmap``
folded examples into it) and query head (``h G + g`` on the dK/dV grid), positions full
``[bq, bk]`` iotas. Each ``mod_params`` leaf is a whole array in SMEM (not scalar-prefetched:
it steers no index map), read at scalar indices (``slopes[h]``, ``prefix[b]``) as scalar
loads; a read at vector indices (a bucket table at ``[bq, bk]`` buckets, document ids at the
tile's positions) has no Mosaic gather from SMEM, so it runs as a select-accumulate over the
range of entries the tile's indices span (:func:`~attnjax.pallas.mods.select_gather`: per
entry a scalar load and a ``[bq, bk]`` select; ``docs/tiled.md`` gives the cost). What still
does not lower (a slice of a leaf, say) is refused, naming the mod, before the Mosaic kernel
is lowered (:func:`~attnjax.pallas.mods.lowering_error`). Float ``mod_params`` get their
gradients as on the Triton path (:func:`attnjax.pallas.mods.with_mod_gradients`).

Block masks (and a ``mask_mod``, whose block mask is built per call) are followed splash-style:
the tile kinds of the shared :meth:`~attnjax.call.AttentionCall.tile_kinds` become the shared
schedules (:func:`~attnjax.pallas.mods.schedules`: per query tile its non-empty key tiles, per
key tile its query tiles, full ones marked), flattened and scalar-prefetched. The loop axis
of each grid runs over the longest list (known while tracing when the block mask is concrete,
else every block); index maps read the list, so a step past it re-reads its last tile and an
empty row rests on the tile the row before held (:func:`_resting`): neither costs a DMA, and
``pl.when`` skips their compute. Full tiles run without any mask.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config  # whether TPU interpret mode is forced
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int, Shaped

from attnjax.call import AttentionCall
from attnjax.masks import EMPTY, MaskSpec
from attnjax.pallas import attention as triton_path
from attnjax.pallas.flash import (
    Additive,
    Dot,
    dot,
    kernel_params,
    key_blocks,
    mod_mask,
    mod_positions,
    modded_logits,
    query_blocks,
)
from attnjax.pallas.mods import SmemParam, lowering_error, schedules, with_mod_gradients
from attnjax.softmax import MASK_VALUE, RowStats, online_finish, online_step, recomputed_probs
from attnjax.tiling import BlockSizes, as_4d, pad_axis, round_up

NAME = "pallas_tpu"
LANES, SUBLANES = 128, 8
# JAX's TPU flash attention (jax.experimental.pallas.ops.tpu.flash_attention,
# BlockSizes.get_default): 128 x 128 tiles for the forward and both backward kernels.
DEFAULT_BLOCKS = BlockSizes(block_q=128, block_k=128)
# Additive tiles form [block_q, block_k, A] float32 on chip (A padded to 128 lanes): 16 x 128
# (the smallest legal bfloat16 tile) keeps each such array at 1 MiB of VMEM for A <= 128.
DEFAULT_ADDITIVE_BLOCKS = BlockSizes(block_q=16, block_k=128)
DTYPES = (jnp.float32, jnp.bfloat16)


class TransposedDot(Dot):
    """The dot tile score (:class:`~attnjax.pallas.flash.Dot`) with ``dK = dSᵀ q`` from an
    explicitly transposed tile, as JAX's TPU flash kernel computes it."""

    @staticmethod
    def grad_k_w(ds, q, k, w):
        del k, w
        return dot(ds.T.astype(q.dtype), q, (1, 0)), None


TRANSPOSED_DOT = TransposedDot()


@dataclasses.dataclass(frozen=True)
class Config:
    """Static settings of one kernel call (the fields :func:`key_blocks` reads, and more)."""

    tile_score: TransposedDot | Additive  # the score of a tile and its gradients
    blocks: BlockSizes
    is_causal: bool
    window: tuple[int, int] | None
    group: int  # query heads per K/V head
    interpret: Any  # None: chosen by the platform lowered for (see _call)
    segments: bool  # segment ids given
    score_mod: Any = None
    mask_mod: Any = None
    mod_treedef: Any = None  # of the mod parameters' leaves (SMEM inputs after segment ids)
    mod_scalars: tuple[bool, ...] = ()  # which leaves were 0-d (passed as [1])
    extent: tuple[int, int] = (1, 1)  # (T, S) unpadded: the positions mods see are clamped
    batch: int = 1  # mods see the batch index modulo this (vmap folds examples into it)
    # With a tile schedule (a mask_mod or block mask): the grid steps over key blocks per
    # query block (forward, dQ) and over query blocks per key block (dK/dV); None: ranges.
    steps: tuple[int, int] | None = None


def tpu_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
    interpret: Any = None,
    check_mods: bool = True,
) -> tuple[Float[Array, "B T N Hv"], None, Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, None, log-sum-exp)``.

    Same contract as :func:`attnjax.chunked.chunked_attention`. ``interpret``: ``None``
    lets the platform the call is lowered for decide (the Mosaic kernel for TPU, Pallas'
    interpreter elsewhere; ``pltpu.force_tpu_interpret_mode`` makes it TPU interpret mode);
    ``False`` forces the Mosaic kernel, ``True`` or ``pltpu.InterpretParams`` an interpreter.
    ``check_mods=False`` skips the mods' TPU lowering check (the caller checks when lowered).
    """
    reason = unsupported(call)
    if reason is not None:
        raise ValueError(reason)
    if query.dtype not in DTYPES:
        raise ValueError(
            f"query: implementation={NAME!r} takes float32 or bfloat16 inputs (Mosaic's support "
            f"for other dtypes depends on the chip), got {query.dtype.name}; use "
            "implementation='chunked'"
        )
    forced = jax_config.pallas_tpu_interpret_mode_context_manager.value is not None
    interpret = platform_interpret(interpret, jax.default_backend(), forced)
    may_lower = interpret is False or (interpret is None and not forced)
    if check_mods and call.has_mods and may_lower:
        reason = lowering_error(call, "tpu")  # the Mosaic kernel may be lowered: mods first
        if reason is not None:
            raise ValueError(reason)
    batch, num_queries, num_heads, _ = query.shape
    num_keys, num_kv = key.shape[1], key.shape[2]
    tile_score = triton_path.TILE_SCORES[call.score_name]
    additive = isinstance(tile_score, Additive)
    default = DEFAULT_ADDITIVE_BLOCKS if additive else DEFAULT_BLOCKS
    blocks = _blocks(call, default, query.dtype, num_queries, num_keys)
    tq, ts = round_up(num_queries, blocks.block_q), round_up(num_keys, blocks.block_k)
    temperature = as_4d(call.temperature)
    w, original_value = None, value
    if additive:  # k' = k W_k per query head: V repeated to N heads, as on the Triton path
        q, k, w = triton_path.fold_additive(query, key, call.score_params, temperature, num_heads)
        value = jnp.repeat(value, num_heads // num_kv, axis=2)
        w = _lanes_last(w[:, None], 1)  # [B, N, 1, A padded to lanes]
    else:
        tile_score = TRANSPOSED_DOT
        q, k = triton_path.fold_dot(call.score_name, query, key, call.score_params, temperature)
    q, k, v = (_lanes_last(x, n) for x, n in ((q, tq), (k, ts), (value, ts)))
    spec = call.mask_spec
    info, segments = triton_path.mask_inputs(spec, batch, num_queries, num_keys, tq, ts)
    if segments is not None:  # replicated over lanes and sublanes (Mosaic's 2-D vectors)
        q_seg, k_seg = segments
        segments = (
            jnp.broadcast_to(q_seg[:, :, None], (*q_seg.shape, LANES)),
            jnp.broadcast_to(k_seg[:, None, :], (batch, SUBLANES, ts)),
        )
    leaves, treedef = jax.tree.flatten(call.mod_params)
    config = Config(
        tile_score,
        blocks,
        spec.is_causal,
        spec.window,
        num_heads // k.shape[1],
        interpret,
        segments is not None,
        call.score_mod,
        call.mask_mod,
        treedef,
        tuple(jnp.ndim(x) == 0 for x in leaves),
        (num_queries, num_keys),
        batch,
    )
    mods = tuple(jnp.reshape(x, (-1,)) if jnp.ndim(x) == 0 else x for x in leaves)
    inputs = (q, k, v, w, info, segments)
    if call.mask_mod is None:  # the causal/window/length ranges bound each loop
        out, lse = flash(config, *inputs, None, mods)
    else:
        out, lse = _scheduled_flash(config, call, inputs, mods)
    out = jnp.swapaxes(out[:, :, :num_queries, : value.shape[-1]], 1, 2).astype(query.dtype)
    outputs = with_mod_gradients((out, lse[:, :, :num_queries]), query, key, original_value, call)
    return outputs[0], None, outputs[1]


def _scheduled_flash(config, call, inputs, mods):
    """:func:`flash` following the tile schedule of the call's block mask or ``mask_mod`` (the
    shared :meth:`~attnjax.call.AttentionCall.tile_kinds` and
    :func:`~attnjax.pallas.mods.schedules`, empty rows given a resting tile by
    :func:`_resting`). The grid runs over the longest lists where the kinds are known while
    tracing: the call's, else a concrete block mask's (an upper bound, unless the mask was
    built for another causal offset, which :meth:`tile_kinds` learns at run time: then a
    ``lax.cond`` takes the grid over every block), else every block."""
    batch, num_heads = inputs[0].shape[:2]
    num_queries, num_keys = config.extent
    kinds = call.tile_kinds((batch, num_heads), num_queries, num_keys, config.blocks)
    tables = tuple(_resting(x) for x in schedules(kinds, num_keys, config.blocks.block_k))

    def run(steps):
        return lambda: flash(dataclasses.replace(config, steps=steps), *inputs, tables, mods)

    every = kinds.shape[:1:-1]  # (key blocks, query blocks)
    block = call.block_mask
    longest = _longest_lists(kinds)
    if longest is not None or block is None or _longest_lists(block.kinds) is None:
        return run(longest or every)()
    same_offset = jnp.asarray(block.offset) == call.mask_spec.offset
    return jax.lax.cond(same_offset, run(_longest_lists(block.kinds)), run(every))


def _longest_lists(kinds) -> tuple[int, int] | None:
    """``(most key tiles visited by a query tile, most query tiles visiting a key tile)``,
    at least 1, or ``None`` for kinds known only at run time."""
    if isinstance(kinds, jax.core.Tracer):
        return None
    visit = np.asarray(kinds) != EMPTY
    return max(1, int(visit.sum(-1).max())), max(1, int(visit.sum(-2).max()))


def _resting(table: Int[Array, "B N R P"]) -> Int[Array, "B N R P"]:
    """The schedule with each empty row's first entry (never computed: its count is 0) set to
    the last tile of the nearest non-empty row before it in its ``(b, h)`` slab, or, before
    the first, to that row's first tile: the index maps rest the row's steps on the block the
    step before them held (or the next row needs), so an empty row costs no DMA."""
    count = table[..., 0]
    last = jnp.take_along_axis(table, jnp.maximum(count, 1)[..., None], axis=-1)[..., 0]
    before = jax.lax.cummax(jnp.where(count > 0, jnp.arange(count.shape[-1]), -1), axis=2)
    after = jnp.argmax(count > 0, axis=-1, keepdims=True)
    rest = jnp.where(
        before >= 0,
        jnp.take_along_axis(last, jnp.maximum(before, 0), axis=-1),
        jnp.take_along_axis(table[..., 1], after, axis=-1),
    )
    return table.at[..., 1].set(jnp.where(count > 0, table[..., 1], rest))


def platform_interpret(interpret: Any, backend: str, tpu_interpret_forced: bool) -> Any:
    """``interpret`` for a call on the default ``backend``, refused (``ValueError``) where
    ``None`` would run Pallas' generic interpreter on a GPU (unless the caller forced TPU
    interpret mode, ``pltpu.force_tpu_interpret_mode``, as the tests do)."""
    if interpret is None and backend == "gpu" and not tpu_interpret_forced:
        raise ValueError(
            f"implementation={NAME!r} is the Mosaic TPU kernel: on a GPU it would run Pallas' "
            "interpreter, orders of magnitude slower; use implementation='pallas' (the GPU "
            "kernel) or 'chunked'"
        )
    return interpret


def unsupported(call: AttentionCall) -> str | None:
    """Why the TPU kernel cannot take this call (yet), or ``None`` when it can."""
    reason = triton_path.unsupported(call, NAME)
    if reason is not None:
        return reason
    for leaf in jax.tree.leaves(call.mod_params) if call.has_mods else ():
        if jnp.dtype(jnp.result_type(leaf)).itemsize != 4:
            return (
                f"mod_params: implementation={NAME!r} keeps mod parameters in SMEM, which "
                f"holds 32-bit scalars (float32, int32), got a {jnp.result_type(leaf)} leaf; "
                "cast it or use implementation='chunked'"
            )
    return None


def refuses(call: AttentionCall, dtype, num_queries: int, num_keys: int) -> str | None:
    """Why the Mosaic kernel would refuse this call on a TPU (what ``implementation=None``
    asks before choosing it), or ``None``: :func:`unsupported`, the dtype, the tiles, and a
    mod that does not lower (one export per distinct call, cached)."""
    reason = unsupported(call)
    if reason is None and jnp.dtype(dtype) not in DTYPES:
        reason = f"{jnp.dtype(dtype).name} inputs (float32 or bfloat16 only)"
    if reason is None:
        additive = isinstance(triton_path.TILE_SCORES[call.score_name], Additive)
        default = DEFAULT_ADDITIVE_BLOCKS if additive else DEFAULT_BLOCKS
        try:
            _blocks(call, default, dtype, num_queries, num_keys)
        except ValueError as error:
            reason = str(error)
    if reason is None and call.has_mods:
        reason = lowering_error(call, "tpu")
    return reason


def _blocks(call, default, dtype, num_queries, num_keys) -> BlockSizes:
    """Checked tiles (the block mask's, else ``block_sizes``, else ``default``): ``block_q`` a
    multiple of the sublane tile (8 for float32, 16 for bfloat16), ``block_k`` of 128 lanes;
    clamped to the lengths rounded up to them. A block mask's tile over a whole sequence is
    the kernel's single padded tile there."""
    sublanes = SUBLANES * 4 // jnp.dtype(dtype).itemsize
    blocks, name = call.blocks(default), "block_sizes"
    if call.block_mask is not None:
        name = "block_mask.block_sizes"
        blocks = BlockSizes(
            round_up(num_queries, sublanes) if blocks.block_q == num_queries else blocks.block_q,
            round_up(num_keys, LANES) if blocks.block_k == num_keys else blocks.block_k,
        )
    for field, multiple in (("block_q", sublanes), ("block_k", LANES)):
        if getattr(blocks, field) % multiple:
            raise ValueError(
                f"{name}.{field}: implementation={NAME!r} needs a multiple of {multiple} "
                f"for {jnp.dtype(dtype).name} (the TPU's tile), got {getattr(blocks, field)}"
            )
    return BlockSizes(
        min(blocks.block_q, round_up(num_queries, sublanes)),
        min(blocks.block_k, round_up(num_keys, LANES)),
    )


def _lanes_last(x: Float[Array, "B L M D"], length: int) -> Float[Array, "B M Lp Dp"]:
    """``[B, L, M, D]`` as ``[B, M, L, D]``, padded with zeros to ``length`` and 128 lanes."""
    x = pad_axis(jnp.swapaxes(x, 1, 2), 2, length)
    return pad_axis(x, 3, round_up(x.shape[3], LANES))


def _row(info_ref, b):
    """``(causal offset, query length, key length)`` of batch ``b`` as scalars."""
    return info_ref[b, 0], info_ref[b, 1], info_ref[b, 2]


def _key_range(config, info_ref, b, i, num_k_blocks):
    """``(lo, full_lo, full_hi, hi)``: the key blocks query block ``i`` visits."""
    return key_blocks(config, _row(info_ref, b), i * config.blocks.block_q, num_k_blocks)


def _query_range(config, info_ref, b, j, num_q_blocks):
    """``(lo, full_lo, full_hi, hi)``: the query blocks that see key block ``j``."""
    return query_blocks(config, _row(info_ref, b), j * config.blocks.block_k, num_q_blocks)


def _clamp(index, ranges, num_blocks):
    """A grid index moved into the visited ``[lo, hi)`` of ``ranges`` (a skipped step re-reads
    a visited block, so the pipeline issues no DMA for it), into ``[0, num_blocks)`` when that
    is empty."""
    return jnp.clip(jnp.clip(index, ranges[0], ranges[3] - 1), 0, num_blocks - 1)


def _range_visit(ranges, index, num_blocks):
    """``(block, visited, full)`` at grid index ``index`` of a loop bounded by ``ranges``
    (``lo, full_lo, full_hi, hi``): the index itself, clamped where skipped."""
    lo, full_lo, full_hi, hi = ranges
    visited = (index >= lo) & (index < hi)
    full = (index >= full_lo) & (index < full_hi)
    return _clamp(index, ranges, num_blocks), visited, full


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Where a kernel reads its tile schedule ``[B', N', R, P]`` (per row of tiles the count,
    then each tile ``j`` as ``j + 1``, partial, or ``-(j + 1)``, full:
    :func:`~attnjax.pallas.mods.schedules`), flattened and scalar-prefetched into SMEM;
    ``B'`` and ``N'`` are 1 or the grid's ``batch`` and query ``heads``."""

    shape: tuple[int, int, int, int]
    batch: int
    heads: int

    def visit(self, ref, b, n, row, step):
        """``(block, visited, full)`` at ``step`` of ``row``'s loop for query head ``n``: past
        the row's list its last tile (an empty row's resting tile), so such steps re-read the
        block the step before them held and cost no DMA."""
        slabs_b, slabs_n, rows, width = self.shape
        slab = (b // (self.batch // slabs_b)) * slabs_n + n // (self.heads // slabs_n)
        at = (slab * rows + row) * width
        count = ref[at]
        entry = ref[at + 1 + jnp.minimum(step, jnp.maximum(count - 1, 0))]
        return jnp.maximum(jnp.abs(entry) - 1, 0), step < count, entry < 0


def _key_visit(config, schedule, prefetch, b, n, i, j, num_k_blocks):
    """``(key block, visited, full)`` at step ``j`` of query block ``i``'s loop: the
    schedule's, else the causal/window/length ranges' (``prefetch``: ``info`` and the
    schedule's refs)."""
    if schedule is not None:
        return schedule.visit(prefetch[1], b, n, i, j)
    return _range_visit(_key_range(config, prefetch[0], b, i, num_k_blocks), j, num_k_blocks)


def _query_visit(config, schedule, prefetch, b, n, j, i, num_q_blocks):
    """``(query block, visited, full)`` at step ``i`` of key block ``j``'s loop (query head
    ``n``), as :func:`_key_visit`."""
    if schedule is not None:
        return schedule.visit(prefetch[1], b, n, j, i)
    return _range_visit(_query_range(config, prefetch[0], b, j, num_q_blocks), i, num_q_blocks)


def _specs(config, shapes, rows_at, keys_at, q_block, k_block):
    """BlockSpecs of q, k, v, dO (``"do"``), row statistics (``"row"``), the additive score
    vector ``w [1, D]`` and segment ids for a grid whose index maps ``rows_at`` and
    ``keys_at`` give ``(b, head, block)``;
    ``q_block`` and ``k_block`` give the blocks alone (segment ids have no head axis)."""
    (d, hv), (bq, bk) = shapes, (config.blocks.block_q, config.blocks.block_k)

    def at(where):
        return lambda *grid: (*where(*grid), 0)

    return {
        "q": pl.BlockSpec((None, None, bq, d), at(rows_at)),
        "k": pl.BlockSpec((None, None, bk, d), at(keys_at)),
        "v": pl.BlockSpec((None, None, bk, hv), at(keys_at)),
        "do": pl.BlockSpec((None, None, bq, hv), at(rows_at)),
        "row": pl.BlockSpec((None, None, bq, LANES), at(rows_at)),
        "w": pl.BlockSpec((None, None, 1, d), lambda *grid: (*rows_at(*grid)[:2], 0, 0)),
        "q_seg": pl.BlockSpec((None, bq, LANES), lambda *grid: (grid[0], q_block(*grid), 0)),
        "k_seg": pl.BlockSpec((None, SUBLANES, bk), lambda *grid: (grid[0], 0, k_block(*grid))),
    }


def _query_grid(config, schedule, shapes, num_k_blocks):
    """Specs for a grid ``(B, N, query block, step)``: rows at the query block, K and V at
    the step's key block (:func:`_key_visit`) of head ``n // G``."""

    def k_block(b, n, i, j, *prefetch):
        return _key_visit(config, schedule, prefetch, b, n, i, j, num_k_blocks)[0]

    return _specs(
        config,
        shapes,
        lambda b, n, i, j, *_: (b, n, i),
        lambda b, n, i, j, *prefetch: (b, n // config.group, k_block(b, n, i, j, *prefetch)),
        lambda b, n, i, j, *_: i,
        k_block,
    )


def _key_grid(config, schedule, shapes, num_q_blocks):
    """Specs for the dK/dV grid ``(B, K, key block, group member g, step)``: K and V at the
    key block, rows at the step's query block (:func:`_query_visit`) of head ``h G + g``."""

    def q_block(b, h, j, g, i, *prefetch):
        n = h * config.group + g
        return _query_visit(config, schedule, prefetch, b, n, j, i, num_q_blocks)[0]

    return _specs(
        config,
        shapes,
        lambda b, h, j, g, i, *prefetch: (
            b,
            h * config.group + g,
            q_block(b, h, j, g, i, *prefetch),
        ),
        lambda b, h, j, g, i, *_: (b, h, j),
        q_block,
        lambda b, h, j, g, i, *_: j,
    )


class OptionalRefs(NamedTuple):
    """A kernel's optional inputs: the score vector ``w`` (loaded) or ``None``, the segment
    id refs or ``None``, and the mod parameters' SMEM refs."""

    w: Any
    segments: Any
    mods: list


def _optional_refs(config, refs):
    """``(OptionalRefs, the other refs)`` of a kernel's refs after the fixed ones (the order of
    :func:`_optional_inputs`)."""
    refs = list(refs)
    w = refs.pop(0)[...] if isinstance(config.tile_score, Additive) else None
    segments = (refs.pop(0), refs.pop(0)) if config.segments else None
    mods = [refs.pop(0) for _ in config.mod_scalars]
    return OptionalRefs(w, segments, mods), refs


def _optional_inputs(specs, w, segments, mods):
    """The optional inputs (score vector, segment ids, mod parameters) and their specs: mod
    parameters are whole arrays in SMEM (mods read them at scalar indices, the program's
    head or batch, or at vector ones through :func:`~attnjax.pallas.mods.select_gather`)."""
    names = ["w"] * (w is not None) + ["q_seg", "k_seg"] * (segments is not None)
    arrays = [x for x in (w, *(segments or ())) if x is not None] + list(mods)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return arrays, [specs[n] for n in names] + [smem] * len(mods)


def _tile_mask(config, info, tile, shape, opt):
    """The tile's mask ``[bq, bk]``: the causal/window bounds of the shared
    :meth:`MaskSpec.diff_bounds`, the lengths, the segment ids (refs ``[bq, 128]`` and
    ``[8, bk]``, replicated as in JAX's kernel, or ``None``) and ``mask_mod``, on 2-D iotas;
    ``tile`` is ``(b, h, q_start, k_start)``.

    Not :meth:`MaskSpec.block`: that builds a ``[..., Tb, Sb]`` mask from 1-D index vectors
    and batch-broadcast lengths and segment ids (outer products Mosaic does not lay out);
    here the indices are 2-D iotas and the lengths scalars read from SMEM."""
    offset, q_len, k_len = info
    q_idx, k_idx = _iotas(tile, shape)
    low, high = MaskSpec(config.is_causal, config.window).diff_bounds()
    mask = (q_idx < q_len) & (k_idx < k_len)
    diff = k_idx - (q_idx + offset)
    if low is not None:
        mask = mask & (diff >= low)
    if high is not None:
        mask = mask & (diff <= high)
    if opt.segments is not None:
        q_seg, k_seg = opt.segments
        mask = mask & (_lanes(q_seg[...], shape[1]) == k_seg[:1, :])
    if config.mask_mod is not None:
        mask = mask & mod_mask(config.mask_mod, *_mod_args(config, info, tile, shape, opt), shape)
    return mask


def _iotas(tile, shape):
    """The tile's query and key positions ``[bq, bk]`` (2-D iotas)."""
    _, _, q_start, k_start = tile
    iota = functools.partial(jax.lax.broadcasted_iota, jnp.int32, shape)
    return q_start + iota(0), k_start + iota(1)


def _mod_args(config, info, tile, shape, opt):
    """``((b, h, q_idx, kv_idx), params)`` as mods see them in a tile: full ``[bq, bk]``
    positions (Mosaic's vectors are 2-D), clamped and offset by the shared
    :func:`~attnjax.pallas.flash.mod_positions`; parameters from SMEM."""
    b, h, *_ = tile
    q_pos, k_pos = mod_positions(config.extent, info[0], *_iotas(tile, shape))
    params = kernel_params(config.mod_treedef, [SmemParam(r) for r in opt.mods], config.mod_scalars)
    return (b % config.batch, h, q_pos, k_pos), params


def _tile_logits(config, info, tile, q, k, opt):
    """The tile's logits after ``score_mod`` and their derivative with respect to the
    unmodified logits (``None`` without a score mod)."""
    s = config.tile_score.logits(q, k, opt.w)
    if config.score_mod is None:
        return s, None
    return modded_logits(config.score_mod, s, *_mod_args(config, info, tile, s.shape, opt))


def _lanes(x: Shaped[Array, "R 128"], width: int) -> Shaped[Array, "R W"]:
    """Lane-replicated row statistics widened (or cut) to ``width`` lanes."""
    if width % LANES == 0:
        return jnp.tile(x, (1, width // LANES))
    return x[:, :width]


class LaneStats(RowStats):
    """Row statistics ``[bq, 128]``, replicated over lanes as in JAX's TPU kernel: Mosaic's
    vectors are 2-D, so the shared online softmax (:mod:`attnjax.softmax`) keeps its running
    max, sum and log-sum-exp this way here."""

    @staticmethod
    def reduce(fn, x):
        return fn(x, axis=1)[:, None]

    @staticmethod
    def widen(stats, width):
        return _lanes(stats, width)


def _when_visited(visit, step):
    """Run ``step(block, masked)`` where ``visit = (block, visited, full)`` says the step
    visits ``block``: unmasked on a full tile."""
    block, visited, full = visit
    pl.when(visited & full)(lambda: step(block, False))
    pl.when(visited & ~full)(lambda: step(block, True))


def _split_prefetch(schedule, refs):
    """``(prefetched refs: info, and the schedule when there is one; the other refs)``."""
    count = 1 if schedule is None else 2
    return refs[:count], refs[count:]


def _forward_kernel(config, schedule, *refs):
    prefetch, (q_ref, k_ref, v_ref, *refs) = _split_prefetch(schedule, refs)
    info_ref = prefetch[0]
    opt, (o_ref, lse_ref, m_ref, l_ref, acc_ref) = _optional_refs(config, refs)
    b, n, i, j = (pl.program_id(axis) for axis in range(4))
    bq, bk = config.blocks.block_q, config.blocks.block_k
    num_steps = pl.num_programs(3)

    carry = (m_ref, l_ref, acc_ref)

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(block, masked):
        info, tile = _row(info_ref, b), (b, n, i * bq, block * bk)
        s, _ = _tile_logits(config, info, tile, q_ref[...], k_ref[...], opt)
        mask = _tile_mask(config, info, tile, s.shape, opt) if masked else None
        weighted_sum = lambda p: dot(p.astype(v_ref.dtype), v_ref[...], (1, 0))  # noqa: E731
        state = online_step(tuple(ref[...] for ref in carry), s, mask, weighted_sum, LaneStats)
        for ref, value in zip(carry, state, strict=True):
            ref[...] = value

    _when_visited(_key_visit(config, schedule, prefetch, b, n, i, j, num_steps), step)

    @pl.when(j == num_steps - 1)
    def _():
        # A row past the query length finishes as a row with no visible key: output 0
        # (selected, so whatever NaN its queries gave), lse -inf.
        total = l_ref[...]
        rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, total.shape, 0)
        total = jnp.where(rows < info_ref[b, 1], total, 0.0)
        out, lse = online_finish((m_ref[...], total, acc_ref[...]), LaneStats)
        o_ref[...] = out.astype(o_ref.dtype)
        lse_ref[...] = lse


def _tile_grads(config, info_ref, tile, refs, opt, masked):
    """A tile's ``q``, ``k``, ``dO``, recomputed probabilities ``P`` and
    ``dS = P ∘ (dO Vᵀ - delta)`` (``[bq, bk]``, times the score mod's derivative) from the
    refs ``(q, k, v, dO, lse, delta)``; ``tile`` is ``(b, h, i, j)``."""
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q, k, do = q_ref[...], k_ref[...], do_ref[...]
    b, h, i, j = tile
    info, tile = _row(info_ref, b), (b, h, i * bq, j * bk)
    s, slope = _tile_logits(config, info, tile, q, k, opt)
    mask = _tile_mask(config, info, tile, s.shape, opt) if masked else None
    p = recomputed_probs(s, lse_ref[...], mask, LaneStats)
    ds = p * (dot(do, v_ref[...], (1, 1)) - _lanes(delta_ref[...], bk))
    return q, k, do, p, ds if slope is None else ds * slope


def _dkv_kernel(config, schedule, *refs):
    prefetch, refs = _split_prefetch(schedule, refs)
    refs, (opt, outputs) = refs[:6], _optional_refs(config, refs[6:])
    b, h, j, g, i = (pl.program_id(axis) for axis in range(5))
    n = h * config.group + g  # the query head

    @pl.when((g == 0) & (i == 0))
    def _():
        for ref in outputs:  # dK, dV (and dw: this key block's share)
            ref[...] = jnp.zeros(ref.shape, jnp.float32)

    def step(block, masked):
        q, k, do, p, ds = _tile_grads(config, prefetch[0], (b, n, block, j), refs, opt, masked)
        dk_ref, dv_ref, *dw_ref = outputs
        dk, dw = config.tile_score.grad_k_w(ds, q, k, opt.w)
        dk_ref[...] += dk
        dv_ref[...] += dot(p.T.astype(do.dtype), do, (1, 0))
        if dw_ref:
            dw_ref[0][...] += dw

    _when_visited(_query_visit(config, schedule, prefetch, b, n, j, i, pl.num_programs(4)), step)


def _dq_kernel(config, schedule, *refs):
    prefetch, refs = _split_prefetch(schedule, refs)
    refs, (opt, (dq_ref,)) = refs[:6], _optional_refs(config, refs[6:])
    b, n, i, j = (pl.program_id(axis) for axis in range(4))

    @pl.when(j == 0)
    def _():
        dq_ref[...] = jnp.zeros(dq_ref.shape, jnp.float32)

    def step(block, masked):
        q, k, _, _, ds = _tile_grads(config, prefetch[0], (b, n, i, block), refs, opt, masked)
        dq_ref[...] += config.tile_score.grad_q(ds, q, k, opt.w)

    _when_visited(_key_visit(config, schedule, prefetch, b, n, i, j, pl.num_programs(3)), step)


def _call(config, schedule, kernel, grid, in_specs, out_specs, out_shape, scratch, *args):
    """``pallas_call`` with ``info`` (and the flattened ``schedule`` when there is one: the
    first ``args``) scalar-prefetched; the last two grid axes reduce. Without an explicit
    ``config.interpret``, the platform the call is lowered for decides: the Mosaic kernel
    for TPU, Pallas' interpreter elsewhere (effect-free, unlike TPU interpret mode, so that
    ``jax.export(..., platforms=["tpu"])`` can drop its branch)."""
    semantics = ("parallel",) * (len(grid) - 2) + ("arbitrary",) * 2

    def run(interpret):
        return pl.pallas_call(
            functools.partial(kernel, config, schedule),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1 if schedule is None else 2,
                grid=grid,
                in_specs=in_specs,
                out_specs=out_specs,
                scratch_shapes=scratch,
            ),
            out_shape=out_shape,
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
            interpret=interpret,
            name=f"attnjax_tpu{kernel.__name__.removesuffix('_kernel')}",
        )

    if config.interpret is not None:
        return run(config.interpret)(*args)
    return jax.lax.platform_dependent(*args, tpu=run(False), default=run(True))


def _prefetched(info, tables, which, batch, heads):
    """``(Schedule or None, the scalar-prefetched arrays)``: ``info``, and the schedule
    ``tables[which]`` (0: per query block, 1: per key block) flattened, when there is one."""
    if tables is None:
        return None, (info,)
    table = tables[which]
    return Schedule(table.shape, batch, heads), (info, table.reshape(-1))


def _forward(config, mods, q, k, v, w, info, segments, tables):
    batch, num_heads, tq, _ = q.shape
    hv, nk = v.shape[-1], k.shape[2] // config.blocks.block_k
    bq = config.blocks.block_q
    schedule, prefetch = _prefetched(info, tables, 0, batch, num_heads)
    steps = nk if config.steps is None else config.steps[0]
    specs = _query_grid(config, schedule, (q.shape[-1], hv), nk)
    optional, optional_specs = _optional_inputs(specs, w, segments, mods)
    out, lse = _call(
        config,
        schedule,
        _forward_kernel,
        (batch, num_heads, tq // bq, steps),
        [specs["q"], specs["k"], specs["v"], *optional_specs],
        [specs["do"], specs["row"]],
        [
            jax.ShapeDtypeStruct((batch, num_heads, tq, hv), v.dtype),
            jax.ShapeDtypeStruct((batch, num_heads, tq, LANES), jnp.float32),
        ],
        [pltpu.VMEM((bq, LANES), jnp.float32)] * 2 + [pltpu.VMEM((bq, hv), jnp.float32)],
        *prefetch,
        q,
        k,
        v,
        *optional,
    )
    return out, lse[..., 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def flash(
    config: Config,
    q: Float[Array, "B N Tp D"],
    k: Float[Array, "B K Sp D"],
    v: Float[Array, "B K Sp Hv"],
    w: Float[Array, "B N 1 D"] | None,
    info: Int[Array, "B 4"],
    segments: tuple[Int[Array, "B Tp 128"], Int[Array, "B 8 Sp"]] | None,
    tables: tuple[Int[Array, "B1 N1 Tq P"], Int[Array, "B1 N1 Sk P2"]] | None,
    mods: tuple[Shaped[Array, "..."], ...],
) -> tuple[Float[Array, "B N Tp Hv"], Float[Array, "B N Tp"]]:
    """``(output, lse)`` of the prepared inputs (padded, heads second), differentiable in
    ``q``, ``k``, ``v`` and the additive score vector ``w`` (``None`` for the dot family);
    ``info`` rows are (causal offset, query length, key length, 0); ``segments`` the segment
    ids replicated over lanes and sublanes, or ``None``; ``tables`` the tile schedules per
    query block and per key block (``config.steps`` set), or ``None``; ``mods`` the mod
    parameters' leaves (0-d ones as ``[1]``; their gradients come from
    :func:`with_mod_gradients`)."""
    forward = _batch_folded(functools.partial(_forward, config))
    return forward(mods, q, k, v, w, info, segments, tables)


def _flash_fwd(config, q, k, v, w, info, segments, tables, mods):
    forward = _batch_folded(functools.partial(_forward, config))
    out, lse = forward(mods, q, k, v, w, info, segments, tables)
    return (out, lse), (mods, q, k, v, w, info, segments, tables, out, lse)


def _flash_bwd(config, residuals, cotangents):
    grads = _batch_folded(functools.partial(_backward, config))(*residuals, *cotangents)
    return *grads, None, None, None, None


def _backward(config, mods, q, k, v, w, info, segments, tables, out, lse, d_out, d_lse):
    """``(dq, dk, dv, dw)``: the dK/dV kernel (and each key block's share of ``dw``), then
    the dQ kernel."""
    batch, num_heads, tq, _ = q.shape
    num_kv, ts = k.shape[1], k.shape[2]
    nq, nk = tq // config.blocks.block_q, ts // config.blocks.block_k
    key_steps, query_steps = (nk, nq) if config.steps is None else config.steps
    delta = jnp.einsum("bnth,bnth->bnt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    rows = lambda x: jnp.broadcast_to(x[..., None], (*x.shape, LANES))  # noqa: E731
    args = (q, k, v, d_out, rows(lse), rows(delta - d_lse))
    names = ("q", "k", "v", "do", "row", "row")
    shapes = (q.shape[-1], v.shape[-1])

    schedule, prefetch = _prefetched(info, tables, 1, batch, num_heads)
    specs = _key_grid(config, schedule, shapes, nq)
    optional, optional_specs = _optional_inputs(specs, w, segments, mods)
    out_specs, out_shape = [specs["k"], specs["v"]], [k.shape, v.shape]
    if w is not None:  # per key block (a parallel axis), summed below; group is 1 here
        per_key_block = lambda b, h, j, *_: (b, h, j, 0, 0)  # noqa: E731
        out_specs.append(pl.BlockSpec((None, None, None, *w.shape[2:]), per_key_block))
        out_shape.append((batch, num_kv, nk, *w.shape[2:]))
    dk, dv, *dw = _call(
        config,
        schedule,
        _dkv_kernel,
        (batch, num_kv, nk, config.group, query_steps),
        [specs[n] for n in names] + optional_specs,
        out_specs,
        [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in out_shape],
        [],
        *prefetch,
        *args,
        *optional,
    )
    schedule, prefetch = _prefetched(info, tables, 0, batch, num_heads)
    specs = _query_grid(config, schedule, shapes, nk)
    optional, optional_specs = _optional_inputs(specs, w, segments, mods)
    dq = _call(
        config,
        schedule,
        _dq_kernel,
        (batch, num_heads, nq, key_steps),
        [specs[n] for n in names] + optional_specs,
        specs["q"],
        jax.ShapeDtypeStruct(q.shape, jnp.float32),
        [],
        *prefetch,
        *args,
        *optional,
    )
    dw = None if w is None else dw[0].sum(axis=2).astype(w.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dw


def _batch_folded(fn):
    """``fn`` (its first argument the mod parameters, unbatched; the other arrays and results
    batch-first) whose ``vmap`` folds the mapped axis into the batch axis: ``pallas_call``'s
    own batching rule adds a grid axis without a dimension semantics for it, which TPU
    kernels refuse. Mods see the batch index modulo the unfolded batch (``Config.batch``)."""
    folded = jax.custom_batching.custom_vmap(fn)

    @folded.def_vmap
    def _(axis_size, in_batched, mods, *args):
        if any(jax.tree.leaves(in_batched[0])):
            raise ValueError(
                f"mod_params: implementation={NAME!r} takes mod parameters shared by the "
                "examples of a vmap (the kernels fold them into the batch); pass per-example "
                "values as a batch axis the mod indexes with b, or use implementation='chunked'"
            )

        def fold(x, batched):
            x = x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            return x.reshape(axis_size * x.shape[1], *x.shape[2:])

        outs = folded(mods, *jax.tree.map(fold, args, tuple(in_batched[1:])))
        unfold = lambda y: y.reshape(axis_size, -1, *y.shape[1:])  # noqa: E731
        return jax.tree.map(unfold, outs), jax.tree.map(lambda _: True, outs)

    return folded


flash.defvjp(_flash_fwd, _flash_bwd)
