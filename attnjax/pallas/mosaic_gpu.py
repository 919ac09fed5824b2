"""A flash kernel on JAX's Mosaic GPU backend (NVIDIA Hopper), the successor of the Triton
kernels (:mod:`attnjax.pallas.triton_backend`), written with ``jax.experimental.pallas.mosaic_gpu``.

One warpgroup per ``[64, H]`` query tile: ``q · kᵀ`` and ``p · v`` on the tensor cores
(``wgmma``), keys and values brought into shared memory by TMA copies two tiles ahead. The
backward pass is one kernel for ``dq`` (over key tiles) and one for ``dk, dv`` (over query
tiles, per query head; GQA sums each group outside). :func:`flash` takes 16-bit ``q'``, ``k``,
``v`` with the score already folded into ``q'`` (as :func:`attnjax.pallas.attention.fold_dot`
does for the dot-family scores), head dims 64 or 128, and ``causal`` (query ``i`` sees keys
``j <= i``).

**Not yet run on a GPU**: no GPU was at hand when it was written. The suite checks that its
kernels lower for CUDA (``jax.export(..., platforms=["cuda"])``) and runs them in Mosaic GPU's
interpreter with plain dots in place of ``wgmma`` (``interpret=True``: the interpreter runs no
``wgmma`` with a register operand) against a dense reference; ``tests/test_pallas_gpu.py``
and ``benchmarks/gpu.sh`` check the tensor-core path and time it on a Hopper GPU.
:func:`attnjax.attention` does not offer it until those have passed there.
"""

import functools
import inspect
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from attnjax.tiling import pad_axis, round_up

try:
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError:  # a JAX without Mosaic GPU
    plgpu = None
# plgpu.load needs an index in jax 0.10, deprecates it in 0.11 and takes none from 0.12
_LOAD_INDEX = plgpu and inspect.signature(plgpu.load).parameters.get("idx")
_LOAD_NEEDS_INDEX = bool(_LOAD_INDEX) and _LOAD_INDEX.default is inspect.Parameter.empty

BLOCK_Q = 64  # one warpgroup's wgmma rows
BLOCK_K = 128  # the forward's key tile
BLOCK_K_BACKWARD = 64  # two [64, H] float32 accumulators stay in registers
LOG2E = math.log2(math.e)


def flash(q, k, v, causal: bool, *, interpret: bool = False):
    """``(softmax(q kᵀ) v [B, T, N, H], log-sum-exp [B, N, T] float32)`` for 16-bit
    ``q [B, T, N, H]``, ``k, v [B, S, K, H]`` (``N`` a multiple of ``K``); ``causal``: query
    ``i`` sees keys ``j <= i``. Anything else is a ``ValueError``. ``interpret``: run the
    kernels in Mosaic GPU's interpreter (CPU; JAX 0.11 and later) with plain dots in place of
    ``wgmma``, which it cannot run with a register operand: the copies, barriers, schedule,
    masks and padding are the kernels' own, the tensor-core path is not (slow: for tests)."""
    _check(q, k, v)
    return _flash(q, k, v, causal, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _flash(q, k, v, causal, interpret):
    return _forward(q, k, v, causal, interpret)


def _check(q, k, v) -> None:
    needs = {
        f"JAX's Mosaic GPU backend (jax {jax.__version__} has none)": plgpu is not None,
        "bfloat16 or float16 inputs of one dtype": q.dtype in (jnp.bfloat16, jnp.float16)
        and k.dtype == v.dtype == q.dtype,
        "a head dim of 64 or 128, the same for q, k and v": q.shape[-1] in (64, 128)
        and k.shape[-1] == v.shape[-1] == q.shape[-1],
        "q [B, T, N, H], k and v [B, S, K, H] with N a multiple of K, T and S at least 1": (
            q.ndim == k.ndim == 4
            and k.shape == v.shape
            and k.shape[0] == q.shape[0]
            and q.shape[2] % k.shape[2] == 0
            and min(q.shape[1], k.shape[1]) > 0
        ),
    }
    missing = [need for need, ok in needs.items() if not ok]
    if missing:
        shapes = (
            f"q {q.dtype}{list(q.shape)}, k {k.dtype}{list(k.shape)}, v {v.dtype}{list(v.shape)}"
        )
        raise ValueError(f"mosaic_gpu.flash needs {'; '.join(missing)}; got {shapes}")


def _flash_fwd(q, k, v, causal, interpret):
    out, lse = _forward(q, k, v, causal, interpret)
    return (out, lse), (q, k, v, out, lse)


def _flash_bwd(causal, interpret, residuals, cotangents):
    q, k, v, out, lse = residuals
    d_out, d_lse = cotangents
    # d lse / d s = p, so the lse cotangent joins the rows' delta: ds = p (dp - delta + d_lse)
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    delta = delta - d_lse
    dq = _backward_dq(q, k, v, d_out, lse, delta, causal, interpret)
    dk, dv = _backward_dkv(q, k, v, d_out, lse, delta, causal, interpret)
    return dq, dk, dv


_flash.defvjp(_flash_fwd, _flash_bwd)


def _padded(q, k, v):
    """Sequences padded to whole tiles: ``(q, k, v, T, S)`` with the lengths before."""
    num_queries, num_keys = q.shape[1], k.shape[1]
    q = pad_axis(q, 1, round_up(num_queries, BLOCK_Q))
    k, v = (pad_axis(x, 1, round_up(num_keys, BLOCK_K)) for x in (k, v))
    return q, k, v, num_queries, num_keys


def _padded_backward(q, k, v, d_out, lse, delta):
    """:func:`_padded` with ``d_out``, ``lse`` and ``delta`` padded like ``q``:
    ``(q, k, v, d_out, lse, delta, T, S)``."""
    q, k, v, num_queries, num_keys = _padded(q, k, v)
    d_out = pad_axis(d_out, 1, q.shape[1])
    lse, delta = (pad_axis(x, 2, q.shape[1]) for x in (lse, delta))
    return q, k, v, d_out, lse, delta, num_queries, num_keys


def _tile(shape, dtype):
    """A shared-memory tile laid out for wgmma (8 x 64 tiles, 128-byte swizzle)."""
    transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    return plgpu.SMEM(shape, dtype, transforms=transforms)


def _visible(shape, row0, col0, rows_are_queries: bool, num_keys: int, causal: bool):
    """``[rows, cols]`` mask of a tile whose first row/column sit at ``row0``/``col0``."""
    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + row0
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + col0
    q_pos, k_pos = (rows, cols) if rows_are_queries else (cols, rows)
    visible = k_pos < num_keys
    return visible & (k_pos <= q_pos) if causal else visible


def _key_steps(q0, num_keys: int, block_k: int, causal: bool):
    """``(unmasked, total)`` key tiles for queries ``q0 ... q0 + 63``: tiles below
    ``unmasked`` are visible to every row; the rest need the mask."""
    total = pl.cdiv(num_keys, block_k)
    unmasked = num_keys // block_k
    if causal:
        total = jnp.minimum(total, pl.cdiv(q0 + BLOCK_Q, jnp.int32(block_k)))
        unmasked = jnp.minimum(unmasked, (q0 + 1) // block_k)
    return unmasked, total


def _forward(q, k, v, causal, interpret):
    batch, num_queries, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    q, k, v, num_queries, num_keys = _padded(q, k, v)
    block_k, dtype = BLOCK_K, q.dtype

    def kernel(q_ref, k_ref, v_ref, out_ref, lse_ref, q_smem, k_smem, v_smem, lse_smem, bars):
        q_bar, k_bars, v_bars = bars
        b, h, q0, fetch = _query_tile(k_ref, v_ref, k_smem, v_smem, k_bars, v_bars, group, block_k)
        unmasked, total = _key_steps(q0, num_keys, block_k, causal)
        plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(q0, BLOCK_Q), h], q_smem, q_bar)
        for slot in range(min(2, k.shape[1] // block_k)):  # static bounds, dynamic guard
            pl.when(slot < total)(functools.partial(fetch, slot, slot))
        plgpu.barrier_wait(q_bar)

        def step(j, carry, masked):
            acc, m, total_p = carry
            slot = j % 2
            plgpu.barrier_wait(k_bars.at[slot])
            s = _matmul(q_smem, k_smem.at[slot].transpose((1, 0)), (BLOCK_Q, block_k), interpret)
            s = s * LOG2E
            if masked:
                seen = _visible(s.shape, q0, j * block_k, True, num_keys, causal)
                s = jnp.where(seen, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=1))
            alpha = jnp.exp2(m - m_new)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
            total_p = total_p * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            plgpu.barrier_wait(v_bars.at[slot])
            acc = _accumulate(acc, p.astype(dtype), v_smem.at[slot], interpret)
            pl.when(j + 2 < total)(lambda: fetch(j + 2, slot))
            return acc, m_new, total_p

        carry = (
            _zeros((BLOCK_Q, head_dim)),
            plgpu.layout_cast(
                jnp.full((BLOCK_Q,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1)
            ),
            plgpu.layout_cast(jnp.zeros((BLOCK_Q,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
        )
        carry = lax.fori_loop(0, unmasked, functools.partial(step, masked=False), carry)
        acc, m, total_p = lax.fori_loop(
            unmasked, total, functools.partial(step, masked=True), carry
        )
        q_smem[...] = (acc / lax.broadcast_in_dim(total_p, acc.shape, [0])).astype(dtype)
        lse_smem[...] = (m + jnp.log2(total_p)) / LOG2E
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, out_ref.at[b, pl.ds(q0, BLOCK_Q), h])
        plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q0, BLOCK_Q)])
        plgpu.wait_smem_to_gmem(0)

    padded_queries = q.shape[1]
    out, lse = _launch(
        kernel,
        interpret,
        out_type=(
            jax.ShapeDtypeStruct(q.shape, dtype),
            jax.ShapeDtypeStruct((batch, num_heads, padded_queries), jnp.float32),
        ),
        scratch_types=(
            _tile((BLOCK_Q, head_dim), dtype),
            _tile((2, block_k, head_dim), dtype),
            _tile((2, block_k, head_dim), dtype),
            plgpu.SMEM((BLOCK_Q,), jnp.float32),
            (plgpu.Barrier(), plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2)),
        ),
        grid=(num_heads, padded_queries // BLOCK_Q, batch),
        grid_names=("h", "q", "b"),
    )(q, k, v)
    return out[:, :num_queries], lse[:, :, :num_queries]


def _query_tile(k_ref, v_ref, k_smem, v_smem, k_bars, v_bars, group, block_k):
    """``(b, h, q0, fetch)`` of a program over one query tile: its batch, head and first row,
    and ``fetch(step, slot)``, which copies key and value tile ``step`` of its KV head into
    shared-memory ``slot`` (each copy signalling its barrier)."""
    b, h, q0 = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("q") * BLOCK_Q

    def fetch(step, slot):
        rows = (b, pl.ds(step * block_k, block_k), h // group)
        for ref, smem, bars in ((k_ref, k_smem, k_bars), (v_ref, v_smem, v_bars)):
            plgpu.copy_gmem_to_smem(ref.at[rows], smem.at[slot], bars.at[slot])

    return b, h, q0, fetch


def _interpreted_dot(a, b_ref):
    """``a @ b_ref`` as plain loads and a dot, then the fence that makes them visible to later
    TMA copies into the same buffers, as a completed wgmma's reads are (the interpreter)."""
    out = jnp.dot(a, b_ref[...], preferred_element_type=jnp.float32)
    plgpu.commit_smem()
    return out


def _load(ref, axis: int):
    """A whole 1-D float32 shared-memory ``ref`` as a row (``axis=1``) or column (``0``) vector
    of the wgmma layout."""
    layout = plgpu.Layout.WGMMA.reduce(axis)
    if _LOAD_NEEDS_INDEX:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def _zeros(shape):
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)


def _launch(kernel, interpret: bool, **kwargs):
    """``plgpu.kernel`` with fast approximate math, or in the interpreter (races raise)."""
    if interpret:
        return plgpu.kernel(kernel, interpret=plgpu.InterpretGPUParams(detect_races=True), **kwargs)
    return plgpu.kernel(kernel, compiler_params=plgpu.CompilerParams(approx_math=True), **kwargs)


def _matmul(a, b, shape, interpret: bool):
    """``a @ b`` (shared-memory operands) into a fresh float32 accumulator of ``shape``."""
    if interpret:
        return _interpreted_dot(a[...], b)

    def run(acc_ref):
        plgpu.wgmma(acc_ref, a, b)
        return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _accumulate(acc, a, b, interpret: bool):
    """``acc + a @ b`` (``a`` in registers or shared memory, ``b`` in shared memory)."""
    if interpret:
        return acc + _interpreted_dot(a, b)

    def run(acc_ref):
        plgpu.wgmma(acc_ref, a, b)

    return pl.run_state(run)(plgpu.ACC.init(acc))


def _backward_dq(q, k, v, d_out, lse, delta, causal, interpret):
    batch, num_queries, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    q, k, v, d_out, lse, delta, num_queries, num_keys = _padded_backward(q, k, v, d_out, lse, delta)
    block_k, dtype = BLOCK_K_BACKWARD, q.dtype

    def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, smem, bars):
        q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem = smem
        in_bar, k_bars, v_bars = bars
        b, h, q0, fetch = _query_tile(k_ref, v_ref, k_smem, v_smem, k_bars, v_bars, group, block_k)
        unmasked, total = _key_steps(q0, num_keys, block_k, causal)
        rows = (b, pl.ds(q0, BLOCK_Q), h)
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, in_bar.at[0])
        plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, in_bar.at[1])
        plgpu.copy_gmem_to_smem(lse_ref.at[b, h, pl.ds(q0, BLOCK_Q)], lse_smem, in_bar.at[2])
        plgpu.copy_gmem_to_smem(delta_ref.at[b, h, pl.ds(q0, BLOCK_Q)], delta_smem, in_bar.at[3])
        for slot in range(min(2, k.shape[1] // block_k)):  # static bounds, dynamic guard
            pl.when(slot < total)(functools.partial(fetch, slot, slot))
        for i in range(4):
            plgpu.barrier_wait(in_bar.at[i])
        lse2 = _load(lse_smem, 1) * LOG2E
        delta = _load(delta_smem, 1)

        def step(j, dq, masked):
            slot = j % 2
            plgpu.barrier_wait(k_bars.at[slot])
            s = _matmul(q_smem, k_smem.at[slot].transpose((1, 0)), (BLOCK_Q, block_k), interpret)
            p = jnp.exp2(s * LOG2E - lax.broadcast_in_dim(lse2, s.shape, [0]))
            if masked:
                seen = _visible(s.shape, q0, j * block_k, True, num_keys, causal)
                p = jnp.where(seen, p, 0.0)
            plgpu.barrier_wait(v_bars.at[slot])
            dp = _matmul(do_smem, v_smem.at[slot].transpose((1, 0)), (BLOCK_Q, block_k), interpret)
            ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))
            dq = _accumulate(dq, ds.astype(dtype), k_smem.at[slot], interpret)
            pl.when(j + 2 < total)(lambda: fetch(j + 2, slot))
            return dq

        dq = lax.fori_loop(
            0, unmasked, functools.partial(step, masked=False), _zeros((BLOCK_Q, head_dim))
        )
        dq = lax.fori_loop(unmasked, total, functools.partial(step, masked=True), dq)
        q_smem[...] = dq.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    dq = _launch(
        kernel,
        interpret,
        out_type=jax.ShapeDtypeStruct(q.shape, dtype),
        scratch_types=(
            (
                _tile((BLOCK_Q, head_dim), dtype),
                _tile((BLOCK_Q, head_dim), dtype),
                _tile((2, block_k, head_dim), dtype),
                _tile((2, block_k, head_dim), dtype),
                plgpu.SMEM((BLOCK_Q,), jnp.float32),
                plgpu.SMEM((BLOCK_Q,), jnp.float32),
            ),
            (
                plgpu.Barrier(num_barriers=4),
                plgpu.Barrier(num_barriers=2),
                plgpu.Barrier(num_barriers=2),
            ),
        ),
        grid=(num_heads, q.shape[1] // BLOCK_Q, batch),
        grid_names=("h", "q", "b"),
    )(q, k, v, d_out, lse, delta)
    return dq[:, :num_queries]


def _backward_dkv(q, k, v, d_out, lse, delta, causal, interpret):
    batch, _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    q, k, v, d_out, lse, delta, _, num_keys = _padded_backward(q, k, v, d_out, lse, delta)
    block_k, dtype = BLOCK_K_BACKWARD, q.dtype
    num_q_tiles = q.shape[1] // BLOCK_Q

    def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, smem, bars):
        k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem = smem
        kv_bar, q_bars, do_bars, lse_bars, delta_bars = bars
        b, h, k0 = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("k") * block_k
        first = k0 // BLOCK_Q if causal else 0  # query tiles before see none of these keys
        # from this query tile on every query sees every key of the tile
        unmasked_from = pl.cdiv(k0 + block_k - 1, jnp.int32(BLOCK_Q)) if causal else 0

        def fetch(i, slot):
            rows = (b, pl.ds(i * BLOCK_Q, BLOCK_Q), h)
            vector = (b, h, pl.ds(i * BLOCK_Q, BLOCK_Q))
            plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem.at[slot], q_bars.at[slot])
            plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem.at[slot], do_bars.at[slot])
            plgpu.copy_gmem_to_smem(lse_ref.at[vector], lse_smem.at[slot], lse_bars.at[slot])
            plgpu.copy_gmem_to_smem(delta_ref.at[vector], delta_smem.at[slot], delta_bars.at[slot])

        kv = (b, pl.ds(k0, block_k), h // group)
        plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem, kv_bar.at[0])
        plgpu.copy_gmem_to_smem(v_ref.at[kv], v_smem, kv_bar.at[1])
        for slot in range(min(2, num_q_tiles)):
            pl.when(first + slot < num_q_tiles)(functools.partial(fetch, first + slot, slot))
        plgpu.barrier_wait(kv_bar.at[0])
        plgpu.barrier_wait(kv_bar.at[1])

        def step(i, carry, masked):
            dk, dv = carry
            slot = (i - first) % 2
            plgpu.barrier_wait(q_bars.at[slot])
            plgpu.barrier_wait(lse_bars.at[slot])
            s_t = _matmul(k_smem, q_smem.at[slot].transpose((1, 0)), (block_k, BLOCK_Q), interpret)
            lse = _load(lse_smem.at[slot], 0)
            p_t = jnp.exp2(s_t * LOG2E - lax.broadcast_in_dim(lse * LOG2E, s_t.shape, [1]))
            if masked:
                seen = _visible(s_t.shape, k0, i * BLOCK_Q, False, num_keys, causal)
                p_t = jnp.where(seen, p_t, 0.0)
            plgpu.barrier_wait(do_bars.at[slot])
            dv = _accumulate(dv, p_t.astype(dtype), do_smem.at[slot], interpret)
            dp_t = _matmul(
                v_smem, do_smem.at[slot].transpose((1, 0)), (block_k, BLOCK_Q), interpret
            )
            plgpu.barrier_wait(delta_bars.at[slot])
            delta = _load(delta_smem.at[slot], 0)
            ds_t = p_t * (dp_t - lax.broadcast_in_dim(delta, dp_t.shape, [1]))
            dk = _accumulate(dk, ds_t.astype(dtype), q_smem.at[slot], interpret)
            plgpu.commit_smem()  # the generic loads of this slot's lse and delta, before TMA
            pl.when(i + 2 < num_q_tiles)(lambda: fetch(i + 2, slot))
            return dk, dv

        carry = (_zeros((block_k, head_dim)), _zeros((block_k, head_dim)))
        end = jnp.minimum(unmasked_from, num_q_tiles)
        carry = lax.fori_loop(first, end, functools.partial(step, masked=True), carry)
        dk, dv = lax.fori_loop(end, num_q_tiles, functools.partial(step, masked=False), carry)
        k_smem[...] = dk.astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        out_rows = (b, pl.ds(k0, block_k), h)
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[out_rows])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[out_rows])
        plgpu.wait_smem_to_gmem(0)

    per_head = jax.ShapeDtypeStruct((batch, k.shape[1], num_heads, head_dim), dtype)
    dk, dv = _launch(
        kernel,
        interpret,
        out_type=(per_head, per_head),
        scratch_types=(
            (
                _tile((block_k, head_dim), dtype),
                _tile((block_k, head_dim), dtype),
                _tile((2, BLOCK_Q, head_dim), dtype),
                _tile((2, BLOCK_Q, head_dim), dtype),
                plgpu.SMEM((2, BLOCK_Q), jnp.float32),
                plgpu.SMEM((2, BLOCK_Q), jnp.float32),
            ),
            (plgpu.Barrier(num_barriers=2),) * 5,
        ),
        grid=(num_heads, k.shape[1] // block_k, batch),
        grid_names=("h", "k", "b"),
    )(q, k, v, d_out, lse, delta)

    def per_kv_head(x):
        x = x[:, :num_keys].astype(jnp.float32)
        x = x.reshape(*x.shape[:2], num_kv_heads, group, head_dim).sum(axis=3)
        return x.astype(dtype)

    return per_kv_head(dk), per_kv_head(dv)
