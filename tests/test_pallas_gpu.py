"""``implementation="pallas"`` compiled for a GPU (Triton), ``"cudnn"``, the sequence-parallel
Pallas blocks and the Mosaic GPU kernel (:mod:`attnjax.pallas.mosaic_gpu`) against the dense
reference.

Skipped without a GPU: on CPU, tests/test_pallas.py runs the same kernels in interpret mode
with smaller tiles than Triton's matmuls accept (they need every dimension >= 16).
Run on a GPU with ``python -m pytest tests/test_pallas_gpu.py`` (see benchmarks/gpu.sh).
"""

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
from attnjax import mods
from attnjax.tiling import BlockSizes
from tests.parity import BF16_TOL, FP32_FWD, assert_matches, max_rel_error, qkv

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")


@pytest.fixture(autouse=True)
def _full_precision_reference():
    """XLA's float32 matmuls default to TF32 on GPUs; the references must not."""
    with jax.default_matmul_precision("highest"):
        yield


B, T, S, N, K, H, A = 2, 200, 333, 4, 2, 64, 32
LENGTHS = {
    "query_seq_lengths": jnp.array([200, 0], jnp.int32),
    "key_value_seq_lengths": jnp.array([77, 333], jnp.int32),
}
TEMPERATURE = jnp.array([0.5, 1.0, 2.0, 3.0])[:, None, None]


def _segments(length, sizes):
    ids = jnp.repeat(jnp.arange(len(sizes)), jnp.array(sizes), total_repeat_length=length)
    return ids[None].repeat(B, 0)


def _additive_params(seed):
    ks = jax.random.split(jax.random.key(seed), 4)
    return {
        "w_q": jax.random.normal(ks[0], (N, H, A)) / H**0.5,
        "w_k": jax.random.normal(ks[1], (H, A)) / H**0.5,
        "v": jax.random.normal(ks[2], (A,)),
        "b": jax.random.normal(ks[3], (A,)),
    }


@pytest.mark.parametrize("blocks", [BlockSizes(64, 32), BlockSizes(128, 64)])
def test_scaled_dot_gqa_causal_offset_lengths_temperature(blocks):
    q, k, v = qkv(0, B, T, S, N, K, H)
    diff = {"temperature": TEMPERATURE, "score_params": {"scale": jnp.asarray(0.1)}}
    assert_matches(
        "pallas",
        q,
        k,
        v,
        diff,
        block_sizes=blocks,
        is_causal=True,
        causal_offset=jnp.asarray(S - T),
        **LENGTHS,
    )


def test_bilinear_segments_window():
    q, k, v = qkv(1, B, T, S, N, K, H)
    w = jax.random.normal(jax.random.key(2), (N, H, H)) / H
    assert_matches(
        "pallas",
        q,
        k,
        v,
        {"score_params": {"w": w}},
        score="bilinear",
        local_window_size=(40, 8),
        causal_offset=jnp.asarray(4),
        q_segment_ids=_segments(T, [60, 70, 70]),
        kv_segment_ids=_segments(S, [100, 110, 123]),
    )


def test_additive_causal_lengths_temperature():
    q, k, v = qkv(3, B, T, S, N, K, H)
    diff = {"score_params": _additive_params(3), "temperature": TEMPERATURE}
    assert_matches("pallas", q, k, v, diff, score="additive", is_causal=True, **LENGTHS)


def test_bfloat16_causal():
    q, k, v = qkv(4, B, T, S, N, K, H, jnp.bfloat16)
    out, _, grads = assert_matches("pallas", q, k, v, is_causal=True)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads[:3])


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, FP32_FWD), (jnp.bfloat16, BF16_TOL)])
def test_matches_jax_nn_and_cudnn(dtype, tol):
    q, k, v = qkv(6, 2, 1024, 1024, 8, 8, 128, dtype)
    actual = aj.attention(q, k, v, is_causal=True, implementation="pallas")
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    assert max_rel_error(actual, expected) <= tol
    if dtype == jnp.bfloat16:
        cudnn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        assert max_rel_error(actual, cudnn) <= tol


def test_mods_and_block_mask_on_the_gpu_kernels():
    """Score and mask mods compiled by Triton: causal + softcap + ALiBi + a learnable relative
    bias, with a document mask (per-batch ids, a block mask); forward and gradients, the
    relative bias table's included."""
    from attnjax import masks

    q, k, v = qkv(5, B, T, S, N, K, H)
    ids = jnp.repeat(jnp.arange(3), jnp.array([100, 133, 100]))[None].repeat(B, 0)
    table = jax.random.normal(jax.random.key(2), (N, 32))
    score_mod = mods.compose(mods.relative_position_bias(), mods.alibi(N), mods.softcap(20.0))
    document = mods.document()
    block = masks.block_mask(
        document, {"document_ids": ids}, B, None, T, S, BlockSizes(64, 32),
        causal_offset=S - T,
    )  # fmt: skip

    def loss(q, k, v, table, implementation):
        out = aj.attention(
            q, k, v, is_causal=True, causal_offset=S - T, score_mod=score_mod,
            mask_mod=document, mod_params={"document_ids": ids, "relative_bias": table},
            implementation=implementation,
            block_mask=block if implementation == "pallas" else None,
        )  # fmt: skip
        return jnp.sum(out * jnp.cos(out)), out

    grad = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
    expected, actual = (grad(q, k, v, table, impl) for impl in ("xla", "pallas"))
    assert max_rel_error(actual[1], expected[1]) <= FP32_FWD
    assert max_rel_error(actual[0], expected[0]) <= 1e-4


SLOPES = jax.random.uniform(jax.random.key(11), (N,), minval=0.1, maxval=1.0)
TABLE = jax.random.normal(jax.random.key(12), (N, 32))
# name: (mod keywords, mod_params); every gallery mod, composed ones and a 0-d parameter
GALLERY = {
    "alibi": ({"score_mod": mods.alibi(N)}, {}),
    "alibi_learnable": ({"score_mod": mods.alibi(param="slopes")}, {"slopes": SLOPES}),
    "softcap": ({"score_mod": mods.softcap(2.0)}, {}),
    "relative_position_bias": (
        {"score_mod": mods.relative_position_bias()}, {"relative_bias": TABLE}
    ),
    "causal": ({"mask_mod": mods.causal()}, {}),
    "sliding_window": ({"mask_mod": mods.sliding_window(40, 8)}, {}),
    "dilated": ({"mask_mod": mods.dilated(3)}, {}),
    "prefix_lm": ({"mask_mod": mods.prefix_lm()}, {"prefix_lengths": jnp.array([250, 0])}),
    "document": ({"mask_mod": mods.document()}, {"document_ids": _segments(S, [100, 110, 123])}),
    "composed": (
        {
            "mask_mod": mods.or_masks(
                mods.and_masks(mods.causal(), mods.sliding_window(64)), mods.dilated(5)
            ),
            "score_mod": mods.compose(mods.alibi(param="slopes"), mods.softcap(2.0)),
        },
        {"slopes": SLOPES},
    ),
    "scalar_parameter": (
        {"score_mod": lambda logits, b, h, q_idx, kv_idx, p: logits * p["s"][...]},
        {"s": jnp.float32(0.7)},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_every_gallery_mod_matches_the_dense_path_with_parameter_gradients(name):
    """Triton-compiled mods against ``implementation="xla"`` with the same mods (which
    tests/test_mods.py checks against plain bias, mask and score references)."""
    mod_kwargs, params = GALLERY[name]
    floats = {n: x for n, x in params.items() if jnp.issubdtype(x.dtype, jnp.floating)}
    data = {n: x for n, x in params.items() if n not in floats}
    q, k, v = qkv(7, B, T, S, N, K, H)

    def loss(q, k, v, floats, implementation):
        out = aj.attention(q, k, v, causal_offset=S - T, mod_params={**floats, **data},
                           implementation=implementation, **mod_kwargs)  # fmt: skip
        return jnp.sum(out * jnp.cos(out)), out

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True), static_argnums=4)
    (expected, out_x), (actual, out_p) = (grad(q, k, v, floats, i) for i in ("xla", "pallas"))
    assert max_rel_error(out_p, out_x) <= FP32_FWD
    assert max_rel_error(actual, expected) <= 1e-4
    assert all(float(jnp.abs(g).max()) > 1e-3 for g in jax.tree.leaves(actual[3]))


@pytest.mark.parametrize(
    "score, params",
    [
        ("dot", None),
        ("scaled_dot", {"scale": jnp.asarray(0.125)}),
        ("cosine", {"scale": jnp.full((N,), 4.0)}),
        ("bilinear", {"w": jax.random.normal(jax.random.key(9), (N, H, H)) / H}),
        ("additive", _additive_params(10)),
        ("additive_relu", _additive_params(11)),
    ],
)
def test_every_score_with_parameter_gradients(score, params):
    q, k, v = qkv(8, B, T, S, N, K, H)
    diff = {"score_params": params} if params else None
    assert_matches("pallas", q, k, v, diff, score=score, is_causal=True, **LENGTHS)


def test_bfloat16_causal_softcap_alibi_and_gqa():
    """The benchmarked mods (docs/performance.md) in bfloat16 against the dense path."""
    q, k, v = qkv(9, B, T, S, N, K, H, jnp.bfloat16)
    score_mod = mods.compose(mods.softcap(20.0), mods.alibi(N))
    assert_matches("pallas", q, k, v, is_causal=True, score_mod=score_mod)


def test_cudnn_implementation_forward_and_gradients():
    q, k, v = qkv(10, 2, 512, 512, 8, 2, 64, jnp.bfloat16)
    kwargs = {"is_causal": True, "key_value_seq_lengths": jnp.array([512, 300], jnp.int32)}
    assert aj.choose_implementation(q, k, v, **kwargs) == "cudnn"
    assert_matches("cudnn", q, k, v, **kwargs)


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_sequence_parallel_pallas_blocks_on_one_device(strategy):
    """``ring_attention`` with Pallas forward blocks on a one-device mesh, forward and
    gradients (a learnable relative bias included) against the dense path."""
    import numpy as np

    from attnjax.sharded import ring_attention

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
    q, k, v = qkv(11, B, S, S, N, K, H)
    kwargs = {"is_causal": True, "score_mod": mods.relative_position_bias()}

    def loss(q, k, v, table, sharded):
        params = {"mod_params": {"relative_bias": table}}
        if sharded:
            out = ring_attention(q, k, v, mesh=mesh, axis="seq", strategy=strategy,
                                 implementation="pallas", **kwargs, **params)  # fmt: skip
        else:
            out = aj.attention(q, k, v, implementation="xla", **kwargs, **params)
        return jnp.sum(out * jnp.cos(out)), out

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True), static_argnums=4)
    (expected, out_x), (actual, out_p) = (grad(q, k, v, TABLE, s) for s in (False, True))
    assert max_rel_error(out_p, out_x) <= FP32_FWD
    assert max_rel_error(actual, expected) <= 1e-4


@pytest.mark.parametrize("causal, head_dim", [(False, 64), (True, 128)])
def test_mosaic_gpu_kernel_forward_and_gradients(causal, head_dim):
    """:func:`attnjax.pallas.mosaic_gpu.flash` with GQA and lengths that are no multiple of a
    tile, the log-sum-exp's gradient included, against the dense path."""
    from attnjax.pallas.mosaic_gpu import flash

    q, k, v = qkv(12, B, T, S, N, K, head_dim, jnp.bfloat16)
    q = (q * head_dim**-0.5).astype(q.dtype)  # the score folded into q, as attnjax does

    def loss(q, k, v, kernel):
        if kernel:
            out, lse = flash(q, k, v, causal)
        else:
            out, lse = aj.attention(q, k, v, scale=1.0, is_causal=causal, return_lse=True,
                                    implementation="xla")  # fmt: skip
        w = jax.random.normal(jax.random.key(7), out.shape)
        return jnp.sum(out.astype(jnp.float32) * w) + jnp.sum(lse * jnp.cos(lse)), (out, lse)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
    expected, actual = grad(q, k, v, False), grad(q, k, v, True)
    assert max_rel_error(actual[1], expected[1]) <= BF16_TOL
    assert max_rel_error(actual[0], expected[0]) <= BF16_TOL


@pytest.mark.parametrize("causal", [False, True])
def test_mosaic_gpu_kernel_matches_cudnn(causal):
    from attnjax.pallas.mosaic_gpu import flash

    q, k, v = qkv(6, 2, 1024, 1024, 8, 8, 128, jnp.bfloat16)
    actual, _ = flash((q * 128**-0.5).astype(q.dtype), k, v, causal)
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    assert max_rel_error(actual, expected) <= BF16_TOL
