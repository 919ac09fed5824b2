"""``implementation="pallas"`` compiled for a GPU (Triton) against the dense reference.

Skipped without a GPU: on CPU, tests/test_pallas.py runs the same kernels in interpret mode
with smaller tiles than Triton's matmuls accept (they need every dimension >= 16).
Run on a GPU with ``python -m pytest tests/test_pallas_gpu.py`` (see benchmarks/gpu.sh).
"""

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
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
    from attnjax import masks, mods

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
