"""``implementation="pallas_tpu"``: the Mosaic TPU kernel in TPU interpret mode on CPU (compiled
on a TPU: ``benchmarks/tpu.sh``), against the dense path and JAX's own TPU flash kernel, and
exported for TPU without one.

TPU interpret mode compiles each kernel in seconds: few small cases, each combining several
features, run with race detection and NaN-filled uninitialized memory.
"""

import contextlib
import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash
from jax.experimental.pallas.ops.tpu import splash_attention as splash

import attnjax as aj
from attnjax import masks, mods, scores
from attnjax.call import AttentionCall
from attnjax.pallas.mods import lowering_error
from attnjax.pallas.tpu import platform_interpret
from tests.parity import FP32_FWD, FP32_GRAD, assert_matches, max_rel_error, qkv

B, T, S, N, K, H = 2, 200, 256, 2, 1, 64  # T pads to 2 tiles of 128; H pads to 128 lanes
IDS = jnp.arange(256)[None] // 100  # three documents, boundaries inside tiles
CHECKED = pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")
# Parallel grid axes split over two simulated cores: a block written from both would race.
TWO_CORES = dataclasses.replace(CHECKED, num_cores_or_threads=2)
INTERPRETER = jax._src.pallas.mosaic.interpret.interpret_pallas_call
# Block-sparse cases: queries at 384 + t, 8 query tiles of 16 over 4 key tiles of 128.
SPARSE_T, SPARSE_S, SPARSE_OFFSET, SPARSE_TILES = 128, 512, 384, aj.BlockSizes(16, 128)
WINDOW = (150, 0)  # keys 234 + t to 384 + t: key tiles 1-3 for query tiles 0-1, else 2-3


def _additive_params(seed, heads, head_dim, hidden):
    """``W_q`` per head, ``W_k`` shared, ``v`` and ``b``: every additive parameter."""
    ks = jax.random.split(jax.random.key(seed), 4)
    return {
        "w_q": jax.random.normal(ks[0], (heads, head_dim, hidden)) * head_dim**-0.5,
        "w_k": jax.random.normal(ks[1], (head_dim, hidden)) * head_dim**-0.5,
        "v": jax.random.normal(ks[2], (hidden,)),
        "b": jax.random.normal(ks[3], (hidden,)),
    }


def runs_kernels(count):
    """Mark a test that runs ``count`` kernels (each records its own race state)."""

    def mark(test):
        test.kernels = count
        return test

    return mark


def _interpreted(params):
    """TPU interpret mode with ``params``, off TPU only (on a TPU the kernels compile)."""
    on_tpu = jax.default_backend() == "tpu"
    return contextlib.nullcontext() if on_tpu else pltpu.force_tpu_interpret_mode(params)


@pytest.fixture(autouse=True)
def _checked_interpret_mode(request, monkeypatch):
    """Every kernel runs in the checked mode; no kernel may race. Each one's race state is
    recorded (the interpreter keeps only the last), and off TPU there must be one for each
    kernel the test runs (``runs_kernels``): a JAX that renames the state fails here rather
    than checking nothing."""
    states = []

    class Recorded(INTERPRETER.RaceDetectionState):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            states.append(self)

    monkeypatch.setattr(INTERPRETER, "RaceDetectionState", Recorded)
    with _interpreted(CHECKED):
        yield
    if jax.default_backend() != "tpu":
        expected = getattr(request.function, "kernels", 0)
        assert len(states) == expected, f"{len(states)} race states for {expected} kernels"
    assert not any(state.races_found for state in states), "a kernel races"


@runs_kernels(3)
def test_scaled_dot_mqa_causal_offset_full_tiles_lengths_temperature():
    """Offset 5: query tile 1 sees key tile 0 whole, so each kernel also runs its unmasked
    step (rows past the query length in it included); batch 0 sees 150 keys and 180
    queries, batch 1 all. On two simulated cores."""
    q, k, v = qkv(0, B, T, S, N, K, H)
    temperature = jnp.array([0.5, 2.0])[:, None, None]
    diff = {"temperature": temperature, "score_params": {"scale": jnp.asarray(0.3)}}
    with _interpreted(TWO_CORES):
        assert_matches(
            "pallas_tpu",
            q,
            k,
            v,
            diff,
            is_causal=True,
            causal_offset=jnp.asarray(5),
            query_seq_lengths=jnp.array([180, T], jnp.int32),
            key_value_seq_lengths=jnp.array([150, S], jnp.int32),
        )


@runs_kernels(3)
def test_bfloat16_cosine_gqa_window_skips_tiles():
    """GQA, 4 query heads over 2 K/V heads. The window (100, 0) around ``t + 100`` (keys ``t``
    to ``t + 100``) skips key tile 0 for query tile 1, in the forward, dK/dV and dQ grids;
    rows 190 on see no key of the 190 (output 0, lse -inf, gradient 0), and the last key
    tile holds padding, masked by the key length."""
    q, k, v = qkv(1, 1, T, 190, 4, 2, H, jnp.bfloat16)
    diff = {"score_params": {"scale": jnp.array([4.0, 8.0, 2.0, 6.0])}}
    out, lse, grads = assert_matches(
        "pallas_tpu",
        q,
        k,
        v,
        diff,
        score="cosine",
        causal_offset=jnp.asarray(100),
        local_window_size=(100, 0),
    )
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads[:3])
    assert np.all(np.asarray(out[:, 190:]) == 0) and np.all(np.isneginf(lse[:, :, 190:]))
    assert np.all(np.asarray(grads[0][:, 190:]) == 0)


@runs_kernels(3)
def test_additive_gqa_causal_offset_lengths_temperature():
    """The additive score (``A = 16``, padded to 128 lanes) with gradients of ``W_q``, ``W_k``,
    ``b``, ``v`` and a per-head temperature; 2 query heads over 1 K/V head; 40 queries (not
    a multiple of the 16-row tile), offset 100 (query tile 2 sees key tile 0 whole: every
    kernel runs its unmasked step), batch 0 sees 150 keys."""
    q, k, v = qkv(7, B, 40, S, N, K, H)
    diff = {
        "score_params": _additive_params(7, N, H, 16),
        "temperature": jnp.array([0.5, 2.0])[:, None, None],
    }
    assert_matches(
        "pallas_tpu",
        q,
        k,
        v,
        diff,
        score="additive",
        is_causal=True,
        causal_offset=jnp.asarray(100),
        key_value_seq_lengths=jnp.array([150, S], jnp.int32),
    )


@runs_kernels(3)
def test_bfloat16_additive_relu_segments():
    """``additive_relu`` on bfloat16 inputs (``q'``, ``k'`` in bfloat16, the ``[bq, bk, A]``
    tile in float32), causal with segment ids whose boundary falls inside a query tile; 40
    queries over 3 tiles of 16, 100 keys in one padded tile."""
    q, k, v = qkv(8, 1, 40, 100, 2, 1, 8, jnp.bfloat16)
    ids = jnp.arange(100)[None] // 20
    diff = {"score_params": _additive_params(8, 2, 8, 8)}
    out, _, grads = assert_matches(
        "pallas_tpu",
        q,
        k,
        v,
        diff,
        score="additive_relu",
        is_causal=True,
        q_segment_ids=ids[:, :40],
        kv_segment_ids=ids,
    )
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads[:3])


@runs_kernels(1)
def test_rows_past_query_length_give_zeros_whatever_they_hold():
    """Rows past the query length give output 0 and lse -inf, as on the dense and chunked
    paths, even when their queries are NaN (they share an unmasked tile with valid rows)."""
    q, k, v = qkv(6, 1, 16, 128, 2, 1, 8)
    q = q.at[:, 10:].set(jnp.nan)
    lengths = jnp.array([10], jnp.int32)
    out, lse = aj.attention(
        q, k, v, query_seq_lengths=lengths, implementation="pallas_tpu", return_lse=True
    )
    assert np.all(np.asarray(out[:, 10:]) == 0) and np.all(np.isneginf(lse[:, :, 10:]))
    assert np.all(np.isfinite(np.asarray(out[:, :10])))


@runs_kernels(6)  # ours: forward, dK/dV, dQ; theirs: forward, dK/dV, dQ
def test_matches_jax_tpu_flash_attention():
    """JAX's TPU kernel (``[B, N, T, H]``, no GQA) on the same inputs, causal with segment ids
    (documents of 100 and 60 keys, boundaries inside tiles): outputs and gradients, ours under
    ``vmap`` over two examples with their own ids and key lengths (theirs: keys past the
    length in a segment of their own)."""
    q, k, v = qkv(2, 2, 256, 256, 1, 1, H)
    w = jax.random.normal(jax.random.key(3), q.shape)
    ids = jnp.arange(256)[None] // jnp.array([[100], [60]])
    lengths = jnp.array([210, 250])  # every query still sees a key of its document

    def ours(q, k, v):  # under vmap: the mapped axis folds into the kernels' batch axis
        def one(q, k, v, ids, length):
            options = {"q_segment_ids": ids, "kv_segment_ids": ids, "is_causal": True}
            return aj.attention(
                q, k, v, key_value_seq_lengths=length, implementation="pallas_tpu", **options
            )

        per_example = (x[:, None] for x in (q, k, v, ids, lengths))  # a batch of 1 each
        return jnp.sum(jax.vmap(one)(*per_example)[:, 0] * w)

    def theirs(q, k, v):
        heads_first = [jnp.swapaxes(x, 1, 2) for x in (q, k, v)]
        kv_ids = jnp.where(jnp.arange(256)[None] < lengths[:, None], ids, -1)
        segments = jax_flash.SegmentIds(q=ids, kv=kv_ids)
        out = jax_flash.flash_attention(
            *heads_first, segment_ids=segments, causal=True, sm_scale=H**-0.5
        )
        return jnp.sum(jnp.swapaxes(out, 1, 2) * w)

    actual = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(q, k, v)
    expected = jax.jit(jax.value_and_grad(theirs, argnums=(0, 1, 2)))(q, k, v)
    assert max_rel_error(actual[0], expected[0]) <= FP32_FWD
    assert max_rel_error(actual[1], expected[1]) <= FP32_GRAD


@runs_kernels(3)
def test_gallery_mods_with_parameters_under_vmap():
    """Every gallery mod with parameters in one call under ``vmap`` (two examples of batch 2,
    which the kernels fold into their batch axis), against ``"xla"`` under the same vmap:
    output, lse and gradients of q, k, v, ALiBi's slopes and T5's table.

    Score mods: ALiBi with learnable slopes (read at ``h``; 2 query heads over 1 K/V head and
    the slopes differ, so a wrong head on the dK/dV grid fails), T5's relative position bias
    (a learnable ``[N, 8]`` table read at each logit's bucket), a soft cap. Mask mods:
    ``prefix_lm`` (a prefix length per batch: batch 1's reaches past the causal bound), a
    sliding window around the query's absolute position and ``document`` (ids per batch read
    at ``q_idx`` and ``kv_idx``, boundaries inside tiles, batch 1's differ). The table and the
    ids are read at vector indices, as the Mosaic kernel reads them (``select_gather``); the
    per-batch parameters at ``b`` within the example (past them without it); the slopes and
    the table, shared by the examples, get their summed gradient. 40 queries at 80 + t (batch
    0's document boundary among them), batch 0 seeing 150 keys."""
    q, k, v = (x.reshape(2, B, *x.shape[1:]) for x in qkv(10, 2 * B, 40, S, N, K, H))
    w = jax.random.normal(jax.random.key(11), q.shape)
    table = jax.random.normal(jax.random.key(12), (N, 8))
    floats = {"slopes": jnp.array([0.05, 0.2]), "relative_bias": table}
    data = {
        "prefix_lengths": jnp.array([3, 90]),
        "document_ids": jnp.arange(S)[None] // jnp.array([[100], [70]]),
    }
    score_mod = mods.compose(
        mods.alibi(param="slopes"), mods.relative_position_bias(8, 64), mods.softcap(3.0)
    )
    mask_mod = mods.and_masks(mods.prefix_lm(), mods.sliding_window(60, 10), mods.document())
    lengths = jnp.array([150, S], jnp.int32)

    def loss(implementation, q, k, v, floats):
        def one(q, k, v):
            return aj.attention(
                q, k, v, score_mod=score_mod, mask_mod=mask_mod, mod_params=floats | data,
                causal_offset=80, key_value_seq_lengths=lengths, implementation=implementation,
                return_lse=True,
            )  # fmt: skip

        out, lse = jax.vmap(one)(q, k, v)
        return jnp.sum(out * w) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

    grad = jax.grad(loss, argnums=(1, 2, 3, 4), has_aux=True)
    expected, actual = (
        jax.jit(functools.partial(grad, name))(q, k, v, floats) for name in ("xla", "pallas_tpu")
    )
    assert max_rel_error(actual[1], expected[1]) <= FP32_FWD
    assert max_rel_error(actual[0], expected[0]) <= FP32_GRAD


@runs_kernels(6)  # ours: forward, dK/dV, dQ; theirs: forward, dQ, dK/dV
def test_softcap_and_window_mods_match_jax_splash_attention():
    """JAX's TPU splash attention (soft-cap, local window mask) against the softcap score mod
    and the sliding_window mask mod: outputs and gradients of q, k, v
    (theirs on one example: splash's kernels do not batch in TPU interpret mode)."""
    q, k, v = qkv(12, 1, 256, 256, 1, 1, H)
    w = jax.random.normal(jax.random.key(13), q.shape)
    cap, window = 2.0, (50, 20)

    def ours(q, k, v):
        mod_options = {"score_mod": mods.softcap(cap), "mask_mod": mods.sliding_window(*window)}
        out = aj.attention(q, k, v, implementation="pallas_tpu", **mod_options)
        return jnp.sum(out * w)

    def theirs(q, k, v):
        local = splash.LocalMask((256, 256), window_size=window, offset=0)
        kernel = splash.make_splash_mha(
            splash.MultiHeadMask([local]),
            attn_logits_soft_cap=cap,
            head_shards=1,
            q_seq_shards=1,
        )
        heads_first = [jnp.swapaxes(x[0], 0, 1) for x in (q * H**-0.5, k, v)]
        return jnp.sum(jnp.swapaxes(kernel(*heads_first), 0, 1) * w[0])

    actual = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(q, k, v)
    expected = jax.jit(jax.value_and_grad(theirs, argnums=(0, 1, 2)))(q, k, v)
    assert max_rel_error(actual[0], expected[0]) <= FP32_FWD
    assert max_rel_error(actual[1], expected[1]) <= FP32_GRAD


def _block_masked(implementation, w, **closed):
    """Jitted ``(output, lse, grads of q, k, v)`` of ``sum(output * w)``: ``closed`` options
    are constants of the trace (a block mask there is known while tracing), the ``traced``
    argument's are not."""

    def loss(q, k, v, traced):
        out, lse = aj.attention(
            q, k, v, implementation=implementation, return_lse=True, **closed, **traced
        )  # fmt: skip
        return jnp.sum(out * w), (out, lse)

    def f(q, k, v, traced):
        grads, (out, lse) = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, traced)
        return out, lse, grads

    return jax.jit(f)


def _keys_before(b, h, q_idx, kv_idx, params):
    """Key lengths as a mask mod (``params["lengths"][b]``): a block mask classifies tiles
    under it and the window together, exactly."""
    return kv_idx < params["lengths"][b]


def _window_block_mask(lengths):
    return masks.block_mask(
        mods.and_masks(mods.sliding_window(*WINDOW), _keys_before), {"lengths": lengths},
        len(lengths), None, SPARSE_T, SPARSE_S, SPARSE_TILES, causal_offset=SPARSE_OFFSET,
    )  # fmt: skip


def _window_lists(length):
    """Per query tile its visible key tiles, per key tile its query tiles: brute force from
    the dense window mask over ``length`` keys."""
    t, s = np.arange(SPARSE_T)[:, None] + SPARSE_OFFSET, np.arange(SPARSE_S)[None]
    visible = (s >= t - WINDOW[0]) & (s <= t + WINDOW[1]) & (s < length)
    tiles = visible.reshape(8, 16, 4, 128).any(axis=(1, 3))
    return tuple([list(np.flatnonzero(x)) for x in by] for by in (tiles, tiles.T))


@contextlib.contextmanager
def _recorded(monkeypatch):
    """``(copies, points)``: the interpreter's copies of input blocks into VMEM (the
    pipeline's DMAs) as ``(input, block indices, grid point)`` and its grid points, recorded
    in TPU interpret mode."""
    copies, points, original = [], [], INTERPRETER.get

    @functools.wraps(original)
    def recorded(*args, input_name=None, **kwargs):
        if input_name is not None:  # a block copied in before a grid step
            copies.append((input_name, tuple(map(int, args[6])), tuple(map(int, args[7]))))
        return original(*args, input_name=input_name, **kwargs)

    def point(token, grid_point, core):
        points.append(tuple(map(int, grid_point)))
        return token

    monkeypatch.setattr(INTERPRETER, "get", recorded)
    with _interpreted(dataclasses.replace(CHECKED, grid_point_recorder=point)):
        yield copies, points
    monkeypatch.setattr(INTERPRETER, "get", original)


def _held(lists, row, step):
    """The tile a grid step holds: its row's list at ``step``, past the list its last, in an
    empty row the tile the row before held (before any, the first row's first)."""
    if lists[row]:
        return lists[row][min(step, len(lists[row]) - 1)]
    before = [x for x in lists[:row] if x]
    return before[-1][-1] if before else next(x for x in lists if x)[0]


@runs_kernels(6)  # ours: forward, dK/dV, dQ; splash: forward, dQ, dK/dV
def test_window_block_mask_matches_xla_chunked_and_splash_skipping_tiles(monkeypatch):
    """A sliding-window block mask (lists of 3 and 2 of the 4 key tiles, some tiles full), a
    jit argument: its grids run over every block (a block mask known while tracing shortens
    them: the test after this one). Batch 1 sees 300 keys (a mask mod in the block mask), so
    its queries from 66 on see none and its query tiles 5-7 have empty lists: output 0, lse
    -inf, zero gradients. Against xla and chunked (output, lse, gradients of q, k, v) and, on
    batch 0, JAX's splash attention with the same local mask.

    Block sparsity measured (off TPU): the interpreter's block copies and grid points in our
    three kernels. Each grid step holds its row's tile from the row's list (per query tile its
    key tiles in the forward and dQ kernels, per key tile its query tiles in dK/dV), past the
    list the last one, and in an empty row (batch 1's query tiles 5-7, key tiles 0 and 3) the
    tile the row before held; a DMA happens exactly where the held block changes, in the
    interpreter's order of rows (it permutes the parallel grid axes). So no empty tile, no
    step past a list and no empty row brings a tile of its own."""
    q, k, v = qkv(16, 2, SPARSE_T, SPARSE_S, 1, 1, H)
    w = jax.random.normal(jax.random.key(17), q.shape)
    lengths = (SPARSE_S, 300)
    traced = {"block_mask": _window_block_mask(jnp.array(lengths, jnp.int32))}
    assert np.all(np.asarray(traced["block_mask"].kinds)[1, :, 5:] == masks.EMPTY)
    with _recorded(monkeypatch) as (copies, points):
        out, lse, grads = _block_masked("pallas_tpu", w, causal_offset=SPARSE_OFFSET)(
            q, k, v, traced
        )
    for name in ("xla", "chunked"):
        expected = _block_masked(name, w, causal_offset=SPARSE_OFFSET)(q, k, v, traced)
        assert max_rel_error((out, lse), expected[:2]) <= FP32_FWD, name
        assert max_rel_error(grads, expected[2]) <= FP32_GRAD, name
    assert np.all(np.asarray(out[1, 66:]) == 0) and np.all(np.isneginf(lse[1, :, 66:]))
    assert np.all(np.asarray(grads[0][1, 66:]) == 0)

    def theirs(q, k, v):
        local = splash.LocalMask((SPARSE_T, SPARSE_S), window_size=WINDOW, offset=SPARSE_OFFSET)
        kernel = splash.make_splash_mha(
            splash.MultiHeadMask([local]), head_shards=1, q_seq_shards=1
        )
        heads_first = [jnp.swapaxes(x, 0, 1) for x in (q * H**-0.5, k, v)]
        out = jnp.swapaxes(kernel(*heads_first), 0, 1)
        return jnp.sum(out * w[0]), out

    grad = jax.jit(jax.grad(theirs, argnums=(0, 1, 2), has_aux=True))
    splash_grads, splash_out = grad(q[0], k[0], v[0])
    assert max_rel_error(out[0], splash_out) <= FP32_FWD
    assert max_rel_error(tuple(g[0] for g in grads), splash_grads) <= FP32_GRAD
    if jax.default_backend() == "tpu":
        return
    rows, cols = zip(*map(_window_lists, lengths), strict=True)  # per batch
    by_kernel = [list(c) for _, c in itertools.groupby(copies, key=lambda c: len(c[2]))]
    grids = [list(p) for _, p in itertools.groupby(points, key=len)]
    # Kernel inputs after the prefetched info and schedule: refs[2] q, refs[3] k, refs[4] v;
    # grid points (b, n, query tile, step), dK/dV (b, h, key tile, g, step); one head per group.
    held = {
        "forward": lambda b, n, i, j: (b, n, _held(rows[b], i, j)),
        "dK/dV": lambda b, h, j, g, i: (b, h, _held(cols[b], j, i)),
        "dQ": lambda b, n, i, j: (b, n, _held(rows[b], i, j)),
    }
    inputs = {"forward": "refs[3]", "dK/dV": "refs[2]", "dQ": "refs[3]"}
    for kernel, grid, name in zip(by_kernel, grids, held, strict=True):
        expected = [x for x, _ in itertools.groupby(held[name](*p) for p in grid)]
        assert [b[:3] for i, b, _ in kernel if i == inputs[name]] == expected, name
        assert len(grid) == 2 * 8 * 4, name  # every block of each batch's one head
    assert [sum(map(len, x)) for x in rows] == [18, 7]  # visible tiles of 32


@runs_kernels(3)
def test_document_block_mask_gqa_never_reads_hidden_keys():
    """A document block mask per batch, traced (a jit argument: the grid runs over every key
    tile), 2 query heads over 1 K/V head, 64 queries at 256 + t over 384 keys. Batch 0's key tile
    0 is document 0, which no query is in: its values are NaN and never reach the output.
    Batch 1 sees 300 keys (the mask mod's and the structured lengths), so its queries from 44
    on (document 2) see none: query tile 3 has an empty list. Against xla and chunked on the
    same inputs with those values 0."""
    num_queries, num_keys, offset = 64, 384, 256
    q, k, v = qkv(18, 2, num_queries, num_keys, 2, 1, H)
    w = jax.random.normal(jax.random.key(19), q.shape)
    sizes = jnp.array([[128, 150, 106], [200, 100, 84]])
    ids = jnp.stack([jnp.repeat(jnp.arange(3), n, total_repeat_length=num_keys) for n in sizes])
    lengths = jnp.array([num_keys, 300], jnp.int32)
    block = masks.block_mask(
        mods.and_masks(mods.document(), _keys_before), {"document_ids": ids, "lengths": lengths},
        2, None, num_queries, num_keys, SPARSE_TILES, causal_offset=offset,
    )  # fmt: skip
    kinds = np.asarray(block.kinds)
    assert np.all(kinds[0, :, :, 0] == masks.EMPTY) and np.all(kinds[1, :, 3:] == masks.EMPTY)
    options = {"causal_offset": offset, "key_value_seq_lengths": lengths}
    traced = {"block_mask": block}
    out, lse, grads = _block_masked("pallas_tpu", w, **options)(
        q, k, v.at[0, :128].set(jnp.nan), traced
    )
    for name in ("xla", "chunked"):
        expected = _block_masked(name, w, **options)(q, k, v.at[0, :128].set(0.0), traced)
        assert max_rel_error((out, lse), expected[:2]) <= FP32_FWD, name
        assert max_rel_error(grads, expected[2]) <= FP32_GRAD, name
    assert np.all(np.asarray(out[1, 44:]) == 0) and np.all(np.isneginf(lse[1, :, 44:]))
    assert np.all(np.asarray(grads[0][1, 44:]) == 0)


def _pallas_grids(jaxpr) -> list[tuple[int, ...]]:
    """The grids of the ``pallas_call``s in ``jaxpr`` and the jaxprs in its equations."""
    grids = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            grids.append(tuple(eqn.params["grid_mapping"].grid))
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    grids += _pallas_grids(sub)
    return grids


def test_a_block_mask_known_while_tracing_runs_grids_over_its_longest_lists():
    """The window block mask over 300 keys closed over (known while tracing): forward and dQ
    loop over the most key tiles a query tile visits (2 of 4), dK/dV over the most query
    tiles visiting a key tile (5 of 8); the ``lax.cond`` for a causal offset other than the
    mask's (known at run time) also holds grids over every block. Read from the traced
    program's ``pallas_call``s (each twice: the Mosaic kernel and the interpreter, chosen by
    the platform lowered for)."""
    q, k, v = qkv(20, 1, SPARSE_T, SPARSE_S, 1, 1, H)
    block = _window_block_mask(jnp.array([300], jnp.int32))
    run = _block_masked("pallas_tpu", q, block_mask=block, causal_offset=SPARSE_OFFSET)
    rows, cols = _window_lists(300)
    longest = max(map(len, rows)), max(map(len, cols))
    assert longest == (2, 5)
    forward, dkv = (1, 1, 8, longest[0]), (1, 1, 4, 1, longest[1])  # dQ: forward's grid
    every = (1, 1, 8, 4), (1, 1, 4, 1, 8)
    assert set(_pallas_grids(run.trace(q, k, v, {}).jaxpr)) == {forward, dkv, *every}


@pytest.mark.parametrize(
    "dtype, options, diff",
    [
        (jnp.float32, {"is_causal": True, "q_segment_ids": IDS, "kv_segment_ids": IDS}, {}),
        (
            jnp.bfloat16,
            {"local_window_size": (64, 0), "key_value_seq_lengths": jnp.array([200])},
            {},
        ),
        (
            jnp.float32,
            {"is_causal": True, "score": "additive"},
            {"score_params": _additive_params(4, 4, H, 16), "temperature": jnp.asarray(2.0)},
        ),
        (
            jnp.float32,
            {
                "score_mod": mods.compose(mods.alibi(param="slopes"), mods.softcap(2.0)),
                "mask_mod": mods.sliding_window(60, 10),
            },
            {"mod_params": {"slopes": jnp.linspace(0.1, 0.4, 4)}},
        ),
        (
            jnp.bfloat16,
            {
                "block_mask": masks.block_mask(
                    mods.sliding_window(60, 10),
                    None,
                    None,
                    None,
                    256,
                    256,
                    aj.BlockSizes(32, 128),
                    causal_offset=5,
                ),
            },
            {},
        ),
    ],
)
def test_lowers_for_tpu(dtype, options, diff):
    """``attention(..., implementation="pallas_tpu")`` exported for TPU on this CPU machine:
    forward, dK/dV and dQ are Mosaic custom calls (the interpreter's branch is dropped),
    gradients of the additive score's parameters included. A block mask known while tracing
    gives two sets: grids over its longest lists, and over every block for a causal offset
    other than the one it was built for (a ``lax.cond`` at run time)."""
    q, k, v = qkv(4, 1, 256, 256, 4, 2, H, dtype)

    def loss(q, k, v, diff):
        out, lse = aj.attention(
            q,
            k,
            v,
            causal_offset=jnp.asarray(5),
            implementation="pallas_tpu",
            return_lse=True,
            **options,
            **diff,
        )
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    text = _exported_for_tpu(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, diff)
    assert text.count("tpu_custom_call") == (6 if "block_mask" in options else 3)


def _exported_for_tpu(fn, *args):
    """The StableHLO text of ``jit(fn)`` exported for TPU, the Mosaic kernel itself (not TPU
    interpret mode); Mosaic's lowering reads the chip generation: an abstract TPU stands in."""
    tpu = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=tpu)
    with pltpu.force_tpu_interpret_mode(None), jax.sharding.use_abstract_mesh(mesh):
        return jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()


def test_every_gallery_mod_lowers_for_tpu():
    """``implementation="pallas"`` with every mod of :mod:`attnjax.mods` (score mods composed,
    mask mods combined with ``and_masks`` and ``or_masks``) exported for TPU: forward, dK/dV
    and dQ are Mosaic custom calls, the float parameters differentiated. The table and the
    document ids are read at vector indices, the slopes and prefix lengths at scalar ones."""
    q, k, v = qkv(4, 1, 256, 256, 4, 2, H)
    score_mod = mods.compose(
        mods.alibi(4),
        mods.alibi(param="slopes"),
        mods.relative_position_bias(8, 64),
        mods.softcap(2.0),
    )
    window = mods.and_masks(
        mods.sliding_window(60, 10), mods.or_masks(mods.causal(), mods.dilated(3))
    )
    mask_mod = mods.and_masks(window, mods.or_masks(mods.prefix_lm(), mods.document()))
    floats = {"slopes": jnp.linspace(0.1, 0.4, 4), "relative_bias": jnp.ones((4, 8))}
    data = {"prefix_lengths": jnp.array([3]), "document_ids": IDS}

    def loss(q, k, v, floats, data):
        out = aj.attention(
            q, k, v, score_mod=score_mod, mask_mod=mask_mod, mod_params=floats | data,
            causal_offset=5, implementation="pallas",
        )  # fmt: skip
        return jnp.sum(out)

    text = _exported_for_tpu(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, floats, data)
    assert text.count("tpu_custom_call") == 3


def test_refuses_what_it_cannot_run():
    q, k, v = qkv(5, 1, 16, 16, 2, 2, 8)
    refused = {
        "score: implementation='pallas_tpu'": {"score": lambda q, k, p: q @ k.mT},
        "bias: implementation='pallas_tpu'": {"bias": jnp.ones((16, 16))},
        r"block_mask\.block_sizes\.block_k: implementation='pallas_tpu' .* multiple of 128": {
            "block_mask": masks.block_mask(
                mods.causal(), None, None, None, 16, 16, aj.BlockSizes(8, 8)
            )
        },
        r"mod_params: .*SMEM.*bfloat16": {
            "score_mod": mods.alibi(param="slopes"),
            "mod_params": {"slopes": jnp.ones(2, jnp.bfloat16)},
        },
        r"block_sizes\.block_k: implementation='pallas_tpu' needs a multiple of 128": {
            "block_sizes": aj.BlockSizes(8, 64)
        },
    }
    for message, kwargs in refused.items():
        with pytest.raises(ValueError, match=message) as error:
            aj.attention(q, k, v, implementation="pallas_tpu", **kwargs)
        assert "chunked" in str(error.value) or "block_sizes" in message
    for dtype in (jnp.float16, jnp.float64):
        with jax.enable_x64(True), pytest.raises(ValueError, match=r"float32 or bfloat16.*chunked"):
            inputs = (x.astype(dtype) for x in (q, k, v))
            aj.attention(*inputs, implementation="pallas_tpu")
    with pytest.raises(ValueError, match=r"mod_params: .* shared by the examples of a vmap"):
        attend = lambda s: aj.attention(  # noqa: E731
            q, k, v, implementation="pallas_tpu", score_mod=mods.alibi(param="slopes"),
            mod_params={"slopes": s},
        )  # fmt: skip
        jax.vmap(attend)(jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"block_sizes\.block_q: .* multiple of 16 for bfloat16"):
        bf16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
        aj.attention(*bf16, implementation="pallas_tpu", block_sizes=aj.BlockSizes(8, 128))


def largest_of_a_row(logits, b, h, q_idx, kv_idx, params):
    """Adds the largest entry of head ``h``'s row of a ``[N, L]`` table: the row is a vector
    load from SMEM, which Mosaic does not lower (Triton does)."""
    return logits + jnp.max(params["relative_bias"][h, :], axis=-1)


def test_a_mod_read_that_does_not_lower_is_refused_before_lowering_for_tpu():
    """Where the Mosaic kernel may be lowered (here: TPU interpret mode not forced), a mod
    whose parameter read does not lower is refused, naming it, before anything runs; reads at
    scalar indices and at vector ones, on one axis or two, lower (checked by exporting a
    one-tile kernel)."""
    q, k, v = qkv(5, 2, 16, 16, 2, 2, 8)
    table = {"relative_bias": jnp.ones((2, 8))}
    with pltpu.force_tpu_interpret_mode(None):
        with pytest.raises(
            ValueError, match=r"score_mod: 'largest_of_a_row.* Mosaic TPU .*load scalars.*'chunked'"
        ):
            aj.attention(
                q, k, v, implementation="pallas_tpu", score_mod=largest_of_a_row, mod_params=table
            )
    reads = {
        "scalar": (
            mods.compose(mods.alibi(param="slopes"), mods.softcap(2.0)),
            mods.or_masks(mods.prefix_lm(), mods.dilated(3)),
            {"slopes": jnp.ones(2), "prefix_lengths": jnp.array([3, 4])},
        ),
        "vector": (
            mods.relative_position_bias(8, 16),
            mods.document(),
            table | {"document_ids": jnp.zeros((2, 16), jnp.int32)},
        ),
        "two axes": (
            lambda logits, b, h, q_idx, kv_idx, params: logits + params["t"][q_idx % 4, kv_idx % 4],
            None,
            {"t": jnp.ones((4, 4))},
        ),
    }
    for name, (score_mod, mask_mod, params) in reads.items():
        call = AttentionCall(
            score=scores.dot,
            score_params={},
            score_mod=score_mod,
            mask_mod=mask_mod,
            mod_params=params,
        )
        assert lowering_error(call, "tpu") is None, name


def test_refuses_a_gpu_unless_tpu_interpret_mode_is_forced():
    """On a GPU the default would be Pallas' generic interpreter: refused, pointing to the GPU
    kernel. CPU keeps the interpreter; TPU interpret mode (these tests) runs anywhere."""
    with pytest.raises(ValueError, match=r"implementation='pallas' .* or 'chunked'"):
        platform_interpret(None, "gpu", tpu_interpret_forced=False)
    assert platform_interpret(None, "gpu", tpu_interpret_forced=True) is None
    assert platform_interpret(None, "cpu", tpu_interpret_forced=False) is None
    assert platform_interpret(True, "gpu", tpu_interpret_forced=False) is True
