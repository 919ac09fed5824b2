"""``implementation="pallas"`` (interpret mode on CPU) against the dense reference and jax.nn.

Pallas interpret mode is slow: few, small cases, each combining several features.
"""

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
from attnjax.tiling import BlockSizes
from tests.parity import FP32_FWD, assert_matches, max_rel_error, qkv

BLOCKS = BlockSizes(8, 8)
B, T, S, N, K, H, A = 2, 13, 21, 4, 2, 8, 8
LENGTHS = {  # batch 0 sees 5 keys; batch 1 has no valid query: empty rows
    "query_seq_lengths": jnp.array([13, 0], jnp.int32),
    "key_value_seq_lengths": jnp.array([5, 21], jnp.int32),
}
SEGMENTS = {
    "q_segment_ids": jnp.repeat(jnp.arange(3), jnp.array([4, 4, 5]))[None].repeat(B, 0),
    "kv_segment_ids": jnp.repeat(jnp.arange(3), jnp.array([6, 7, 8]))[None].repeat(B, 0),
}
TEMPERATURE = jnp.array([0.5, 1.0, 2.0, 3.0])[:, None, None]


def _additive_params(seed):
    ks = jax.random.split(jax.random.key(seed), 4)
    return {
        "w_q": jax.random.normal(ks[0], (N, H, A)),
        "w_k": jax.random.normal(ks[1], (H, A)),
        "v": jax.random.normal(ks[2], (A,)),
        "b": jax.random.normal(ks[3], (A,)),
    }


def test_scaled_dot_gqa_causal_offset_lengths_temperature():
    q, k, v = qkv(0, B, T, S, N, K, H)
    diff = {"temperature": TEMPERATURE, "score_params": {"scale": jnp.asarray(0.3)}}
    assert_matches(
        "pallas",
        q,
        k,
        v,
        diff,
        block_sizes=BLOCKS,
        is_causal=True,
        causal_offset=jnp.asarray(S - T),
        **LENGTHS,
    )


def test_bilinear_segments_window():
    q, k, v = qkv(1, B, T, S, N, K, H)
    w = jax.random.normal(jax.random.key(2), (N, H, H)) / 3
    assert_matches(
        "pallas",
        q,
        k,
        v,
        {"score_params": {"w": w}},
        score="bilinear",
        block_sizes=BLOCKS,
        local_window_size=(3, 2),
        causal_offset=jnp.asarray(4),
        **SEGMENTS,
    )


def test_additive_causal_lengths_temperature():
    q, k, v = qkv(3, B, T, S, N, K, H)
    diff = {"score_params": _additive_params(3), "temperature": TEMPERATURE}
    assert_matches(
        "pallas", q, k, v, diff, score="additive", block_sizes=BLOCKS, is_causal=True, **LENGTHS
    )


def test_bfloat16():
    q, k, v = qkv(4, B, T, S, N, K, H, jnp.bfloat16)
    out, _, grads = assert_matches("pallas", q, k, v, block_sizes=BLOCKS, is_causal=True)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads[:3])


@pytest.mark.parametrize(
    "score, params",
    [
        ("dot", None),
        ("cosine", {"scale": jnp.full((N,), 4.0)}),
        ("additive_relu", _additive_params(5)),
    ],
)
def test_other_scores_forward_decoding(score, params):
    q, k, v = qkv(5, B, 1, S, N, K, H)
    kwargs = dict(score=score, score_params=params, is_causal=True, causal_offset=S - 1)
    expected = aj.attention(q, k, v, implementation="xla", **kwargs)
    actual = aj.attention(q, k, v, implementation="pallas", block_sizes=BLOCKS, **kwargs)
    assert max_rel_error(actual, expected) <= FP32_FWD


def test_matches_jax_nn():
    q, k, v = qkv(6, 1, 16, 16, N, K, H)
    expected = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    actual = aj.attention(q, k, v, is_causal=True, implementation="pallas", block_sizes=BLOCKS)
    assert max_rel_error(actual, expected) <= FP32_FWD


def test_refuses_what_it_cannot_run():
    q, k, v = qkv(7, 1, 4, 4, 2, 2, H)
    with pytest.raises(ValueError, match="score: implementation='pallas'"):
        aj.attention(q, k, v, score=lambda q, k, p: q @ k.mT, implementation="pallas")
    with pytest.raises(ValueError, match="mask: implementation='pallas'"):
        aj.attention(q, k, v, mask=jnp.ones((4, 4), bool), implementation="pallas")
    with pytest.raises(ValueError, match="bias: implementation='pallas'"):
        aj.attention(q, k, v, bias=jnp.ones((4, 4)), implementation="pallas")
    with pytest.raises(ValueError, match="temperature: implementation='pallas'"):
        aj.attention(q, k, v, temperature=jnp.ones((4, 4)), implementation="pallas")
    with pytest.raises(ValueError, match=r"block_sizes\.block_q"):
        aj.attention(q, k, v, implementation="pallas", block_sizes=BlockSizes(6, 8))
    with pytest.raises(ValueError, match="return_weights"):
        aj.attention(q, k, v, implementation="pallas", return_weights=True)
