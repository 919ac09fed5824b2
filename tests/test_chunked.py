"""``implementation="chunked"`` against the dense reference and ``jax.nn``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from attnjax.tiling import BlockSizes
from tests.parity import assert_matches, max_rel_error, qkv, run

SMALL = BlockSizes(4, 8)
B, T, S, N, K, H, A = 2, 13, 21, 4, 2, 8, 6


def _params(seed):
    ks = jax.random.split(jax.random.key(seed), 4)
    return {
        "additive": {
            "w_q": jax.random.normal(ks[0], (N, H, A)),
            "w_k": jax.random.normal(ks[1], (H, A)),
            "v": jax.random.normal(ks[2], (A,)),
            "b": jax.random.normal(ks[3], (A,)),
        },
        "cosine": {"scale": jnp.full((N,), 4.0)},
    }


def _lengths(q_len, kv_len):
    return {
        "query_seq_lengths": jnp.array(q_len, jnp.int32),
        "key_value_seq_lengths": jnp.array(kv_len, jnp.int32),
    }


def _segments():
    rng = np.random.default_rng(0)
    return {
        "q_segment_ids": jnp.asarray(np.sort(rng.integers(0, 3, (B, T)), axis=1)),
        "kv_segment_ids": jnp.asarray(np.sort(rng.integers(0, 3, (B, S)), axis=1)),
    }


# batch 1 has no valid query and batch 0 no valid key beyond 5: empty rows
EMPTY_ROWS = _lengths([13, 0], [5, 21])
SCALE = {"score_params": {"scale": jnp.asarray(0.3)}}
MASKS = {  # name: (block sizes, mask arguments)
    "causal_offset": (SMALL, {"is_causal": True, "causal_offset": jnp.asarray(S - T)}),
    "window_segments": (
        BlockSizes(16, 5),
        {"local_window_size": (3, 2), "causal_offset": jnp.asarray(4), **_segments()},
    ),
    "lengths": (SMALL, EMPTY_ROWS),
}


@pytest.mark.parametrize("masks", sorted(MASKS))
def test_masks_gqa_odd_lengths(masks):
    q, k, v = qkv(0, B, T, S, N, K, H)
    blocks, kwargs = MASKS[masks]
    assert_matches("chunked", q, k, v, SCALE, block_sizes=blocks, **kwargs)


@pytest.mark.parametrize("score", ["additive", "cosine"])
def test_scores_with_bias_temperature_and_params(score):
    q, k, v = qkv(1, B, T, S, N, K, H)
    bias = jax.random.normal(jax.random.key(2), (1, N, T, S))
    temperature = jnp.array([0.5, 1.0, 2.0, 3.0])[:, None, None]
    diff = {"bias": bias, "temperature": temperature, "score_params": _params(1)[score]}
    assert_matches("chunked", q, k, v, diff, score=score, block_sizes=SMALL, is_causal=True)


def _callable_score(q, k, params):
    scaled = jnp.sin(q) * params["a"][None, None, None]
    return jnp.einsum("bnth,bnsh->bnts", scaled, k) + params["c"]


def test_callable_score_with_dense_mask():
    q, k, v = qkv(3, B, T, S, N, N, H)
    mask = jax.random.bernoulli(jax.random.key(4), 0.3, (B, 1, T, S))
    mask = mask.at[0, :, 2].set(False)  # a fully masked row
    params = {"a": jnp.full((H,), 0.7), "c": jnp.asarray(0.1)}
    assert_matches(
        "chunked", q, k, v, {"score_params": params},
        score=_callable_score, mask=mask, block_sizes=SMALL,
    )  # fmt: skip


def test_decoding_one_query():
    q, k, v = qkv(5, B, 1, S, N, K, H)
    offset = {"causal_offset": jnp.asarray(S - 1)}
    assert_matches("chunked", q, k, v, is_causal=True, block_sizes=SMALL, **offset)


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    q, k, v = qkv(6, B, T, S, N, K, H)
    out, lse, grads = run("chunked", q, k, v, SCALE, block_sizes=SMALL, **EMPTY_ROWS)
    assert np.all(np.asarray(out[1]) == 0)
    assert np.all(np.isneginf(np.asarray(lse[1])))
    assert np.all(np.asarray(grads[0][1]) == 0)
    assert np.all(np.asarray(grads[1][0, 5:]) == 0) and np.all(np.asarray(grads[2][0, 5:]) == 0)


def test_bfloat16():
    q, k, v = qkv(7, B, T, S, N, K, H, jnp.bfloat16)
    out, _, grads = assert_matches("chunked", q, k, v, block_sizes=SMALL, is_causal=True)
    assert out.dtype == jnp.bfloat16
    assert all(g.dtype == jnp.bfloat16 for g in grads[:3])


@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_jax_nn(is_causal):
    q, k, v = qkv(8, 1, 37, 37, N, K, H)
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=is_causal)
    actual = aj.attention(
        q, k, v, is_causal=is_causal, implementation="chunked", block_sizes=BlockSizes(8, 16)
    )
    assert max_rel_error(actual, expected) <= 1e-5


def test_unbatched_and_default_dispatch():
    q, k, v = qkv(9, 1, 600, 600, 2, 2, H)
    short = aj.attention(q[0, :8], k[0, :8], v[0, :8], implementation="chunked")
    assert max_rel_error(short, aj.attention(q[0, :8], k[0, :8], v[0, :8])) <= 1e-5
    default = aj.attention(q, k, v)  # long enough for the chunked path
    assert max_rel_error(default, aj.attention(q, k, v, implementation="xla")) <= 1e-5


def test_errors():
    q, k, v = qkv(10, 1, 4, 4, 2, 2, H)
    with pytest.raises(ValueError, match="return_weights"):
        aj.attention(q, k, v, implementation="chunked", return_weights=True)
    with pytest.raises(ValueError, match=r"block_sizes\.block_k"):
        aj.attention(q, k, v, implementation="chunked", block_sizes=BlockSizes(4, 0))
    with pytest.raises(TypeError, match="block_sizes"):
        aj.attention(q, k, v, implementation="chunked", block_sizes=(4, 4))
    with pytest.raises(ValueError, match="temperature"):
        aj.attention(q, k, v, temperature=jnp.ones((3,)))
    _, weights = aj.attention(q, k, v, return_weights=True)  # None picks dense for weights
    assert weights.shape == (1, 2, 4, 4)
