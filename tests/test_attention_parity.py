"""``attention`` against ``jax.nn.dot_product_attention``: forward, residual and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj

# (B, T, S, N, K, H): unequal lengths, GQA, MQA, one-token queries.
SHAPES = [(2, 5, 7, 4, 2, 8), (2, 8, 8, 4, 4, 16), (1, 1, 9, 4, 1, 8)]
CASES = [
    # shape index, dtype, is_causal, mask, bias, query lengths, key lengths, window
    (0, "float32", False, False, False, None, None, None),
    (0, "float32", True, False, True, None, None, None),
    (0, "float32", False, True, False, [3, 5], [7, 2], None),
    (0, "bfloat16", True, True, True, None, [4, 7], None),
    (1, "float32", True, False, False, None, None, (2, 1)),
    (1, "float32", False, True, True, [8, 6], [5, 8], 3),
    (1, "bfloat16", False, False, True, None, None, None),
    (2, "float32", False, False, True, None, [9], None),
    (2, "float32", True, True, False, None, None, None),
]
TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (2e-2, 5e-2)}  # (forward, gradient)


def _inputs(shape, dtype, use_mask, use_bias, seed=0):
    b, t, s, n, k, h = shape
    keys = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(keys[0], (b, t, n, h), dtype)
    kk = jax.random.normal(keys[1], (b, s, k, h), dtype)
    v = jax.random.normal(keys[2], (b, s, k, h), dtype)
    bias = jax.random.normal(keys[3], (b, n, t, s)) if use_bias else None
    mask = jax.random.bernoulli(keys[4], 0.7, (b, 1, t, s)) if use_mask else None
    cotangent = jax.random.normal(keys[5], (b, t, n, h))
    return q, kk, v, bias, mask, cotangent


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_jax_nn_forward_residual_and_gradients(case):
    shape_id, dtype, is_causal, use_mask, use_bias, q_len, kv_len, window = case
    q, k, v, bias, mask, cotangent = _inputs(SHAPES[shape_id], jnp.dtype(dtype), use_mask, use_bias)
    kwargs = dict(
        mask=mask,
        is_causal=is_causal,
        query_seq_lengths=None if q_len is None else jnp.array(q_len, jnp.int32),
        key_value_seq_lengths=None if kv_len is None else jnp.array(kv_len, jnp.int32),
        local_window_size=window,
    )
    out, weights, lse = aj.attention(
        q, k, v, bias, return_weights=True, return_residual=True, **kwargs
    )
    ref, ref_lse = jax.nn.dot_product_attention(q, k, v, bias, return_residual=True, **kwargs)
    # jax.nn averages V on rows with no visible key; attnjax returns 0 there (compared below).
    nonempty = (weights.sum(-1) > 0).transpose(0, 2, 1)[..., None]  # [B, T, N, 1]
    fwd_tol, grad_tol = TOLERANCE[dtype]
    out32, ref32 = out.astype(jnp.float32), ref.astype(jnp.float32)
    np.testing.assert_allclose(out32 * nonempty, ref32 * nonempty, atol=fwd_tol, rtol=fwd_tol)
    np.testing.assert_array_equal(out32 * ~nonempty, 0.0)
    assert lse.shape == ref_lse.shape and lse.dtype == ref_lse.dtype  # [B, T, N], input dtype
    np.testing.assert_allclose(
        jnp.where(nonempty[..., 0], lse.astype(jnp.float32), 0.0),
        jnp.where(nonempty[..., 0], ref_lse.astype(jnp.float32), 0.0),
        atol=fwd_tol * 10,
        rtol=fwd_tol,
    )

    def loss(fn, q, k, v, bias):
        return (fn(q, k, v, bias, **kwargs).astype(jnp.float32) * cotangent * nonempty).sum()

    argnums = (0, 1, 2, 3) if use_bias else (0, 1, 2)
    grads = jax.grad(functools.partial(loss, aj.attention), argnums)(q, k, v, bias)
    ref_grads = jax.grad(functools.partial(loss, jax.nn.dot_product_attention), argnums)(
        q, k, v, bias
    )
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(
            g.astype(jnp.float32), r.astype(jnp.float32), atol=grad_tol, rtol=grad_tol
        )


def test_unbatched_inputs_match_batched():
    q, k, v, bias, _, _ = _inputs(SHAPES[0], jnp.float32, False, True)
    out = aj.attention(q[1], k[1], v[1], bias[1], is_causal=True)
    np.testing.assert_allclose(out, aj.attention(q, k, v, bias, is_causal=True)[1], atol=1e-6)
    np.testing.assert_allclose(
        out, jax.nn.dot_product_attention(q[1], k[1], v[1], bias[1], is_causal=True), atol=1e-5
    )


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_residual_vjp_in_jax_nn_layout_equals_jax_nn(implementation):
    """``return_residual`` is ``jax.nn``'s: ``[B, T, N]`` in the input dtype, its gradient
    stopped, so ``jax.vjp`` takes a cotangent in that layout and gives ``jax.nn``'s
    gradients (the residual's cotangent contributes nothing)."""
    q, k, v, _, _, cotangent = _inputs(SHAPES[0], jnp.float32, False, False)
    fn = functools.partial(aj.attention, is_causal=True, return_residual=True)
    (out, lse), vjp = jax.vjp(functools.partial(fn, implementation=implementation), q, k, v)
    (_, ref_lse), ref_vjp = jax.vjp(
        functools.partial(jax.nn.dot_product_attention, is_causal=True, return_residual=True),
        q,
        k,
        v,
    )
    assert lse.shape == ref_lse.shape == q.shape[:-1] and lse.dtype == ref_lse.dtype
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5)
    d_lse = jax.random.normal(jax.random.key(9), lse.shape)
    for got, want in zip(vjp((cotangent, d_lse)), ref_vjp((cotangent, d_lse)), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    for got in vjp((jnp.zeros_like(out), d_lse)):
        np.testing.assert_array_equal(got, 0.0)


def test_return_lse_is_attnjax_differentiable_float32_log_sum_exp():
    """``return_lse``: ``[B, N, T]`` float32, differentiable, next to ``return_residual``."""
    q, k, v, _, _, _ = _inputs(SHAPES[0], jnp.bfloat16, False, False)
    _, residual, lse = aj.attention(q, k, v, return_residual=True, return_lse=True)
    assert lse.dtype == jnp.float32 and lse.shape == (2, 4, 5)
    np.testing.assert_array_equal(residual, lse.transpose(0, 2, 1).astype(jnp.bfloat16))
    grad = jax.grad(lambda q: aj.attention(q, k, v, return_lse=True)[1].sum())(q)
    assert jnp.abs(grad.astype(jnp.float32)).sum() > 0
