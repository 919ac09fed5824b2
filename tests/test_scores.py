import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax import scores

RNG = np.random.default_rng(0)
Q = RNG.normal(size=(2, 3, 5, 4)).astype(np.float32)  # [B, N, T, H]
K = RNG.normal(size=(2, 3, 6, 4)).astype(np.float32)  # [B, N, S, H]


def _loop(fn):
    """Reference: apply ``fn(q_vec, k_vec, n)`` to every (b, n, t, s) with Python loops."""
    out = np.zeros((*Q.shape[:3], K.shape[2]), np.float32)
    for b, n, t, s in itertools.product(*map(range, out.shape)):
        out[b, n, t, s] = fn(Q[b, n, t], K[b, n, s], n)
    return out


def test_dot_and_scaled_dot_match_formula():
    dots = _loop(lambda q, k, n: q @ k)
    np.testing.assert_allclose(scores.dot(Q, K), dots, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores.scaled_dot(Q, K), dots / 2.0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores.scaled_dot(Q, K, 0.3), 0.3 * dots, rtol=1e-5, atol=1e-6)


def test_bilinear_matches_formula_with_per_head_weights():
    w = RNG.normal(size=(3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(
        scores.bilinear(Q, K, w), _loop(lambda q, k, n: q @ w[n] @ k), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("activation", [jnp.tanh, jax.nn.relu])
def test_additive_matches_formula(activation):
    w_q, w_k = RNG.normal(size=(2, 3, 4, 7)).astype(np.float32)
    v, b = RNG.normal(size=(2, 7)).astype(np.float32)
    act = np.tanh if activation is jnp.tanh else (lambda x: np.maximum(x, 0))
    expected = _loop(lambda q, k, n: v @ act(q @ w_q[n] + k @ w_k[n] + b))
    got = scores.additive(Q, K, w_q, w_k, v, b, activation=activation)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_cosine_matches_formula_and_is_bounded_by_scale():
    scale = np.array([1.0, 2.0, 5.0], np.float32)
    expected = _loop(lambda q, k, n: scale[n] * q @ k / np.linalg.norm(q) / np.linalg.norm(k))
    got = scores.cosine(Q, K, scale)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(got) <= scale[:, None, None] + 1e-6)


def test_cosine_gradient_is_finite_at_zero_query():
    k = jnp.ones((3, 4))
    grad = jax.grad(lambda q: scores.cosine(q, k).sum())(jnp.zeros((2, 4)))
    assert np.all(np.isfinite(grad))


def test_rotating_unit_key_gives_cosine_of_angle():
    theta = np.linspace(0, 2 * np.pi, 17, dtype=np.float32)
    keys = np.stack([np.cos(theta), np.sin(theta)], -1)
    q = np.array([[1.0, 0.0]], np.float32)
    np.testing.assert_allclose(scores.dot(q, keys)[0], np.cos(theta), atol=1e-6)
    np.testing.assert_allclose(scores.cosine(q, 3.0 * keys)[0], np.cos(theta), atol=1e-5)


def test_bilinear_is_even_and_biasless_additive_is_odd():
    w = RNG.normal(size=(4, 4)).astype(np.float32)
    np.testing.assert_allclose(scores.bilinear(-Q, -K, w), scores.bilinear(Q, K, w), rtol=1e-5)
    w_q, w_k = RNG.normal(size=(2, 4, 7)).astype(np.float32)
    v = RNG.normal(size=(7,)).astype(np.float32)
    np.testing.assert_allclose(
        scores.additive(-Q, -K, w_q, w_k, v), -scores.additive(Q, K, w_q, w_k, v), atol=1e-5
    )
    b = np.ones(7, np.float32)
    assert not np.allclose(
        scores.additive(-Q, -K, w_q, w_k, v, b), -scores.additive(Q, K, w_q, w_k, v, b)
    )


@pytest.mark.parametrize("head_dim", [4, 64, 256])
def test_dot_variance_grows_with_head_dim_and_scaling_keeps_it_one(head_dim):
    # 20000 independent pairs: the relative standard error of a variance estimate is
    # ~sqrt(2/n) * sqrt(kurtosis-ish) < 3%; the 12% tolerance is > 4 standard errors.
    kq, kk = jax.random.split(jax.random.key(head_dim))
    q = jax.random.normal(kq, (20000, 1, head_dim))
    k = jax.random.normal(kk, (20000, 1, head_dim))
    np.testing.assert_allclose(jnp.var(scores.dot(q, k)), head_dim, rtol=0.12)
    np.testing.assert_allclose(jnp.var(scores.scaled_dot(q, k)), 1.0, rtol=0.12)


def test_logit_depends_only_on_its_query_and_key():
    """Any block of logits equals the same block of the full matrix (what tiling relies on)."""
    w_q, w_k = RNG.normal(size=(2, 4, 7)).astype(np.float32)
    v = RNG.normal(size=(7,)).astype(np.float32)
    fns = [
        scores.dot,
        scores.scaled_dot,
        scores.cosine,
        lambda q, k: scores.bilinear(q, k, w_q @ w_k.T),
        lambda q, k: scores.additive(q, k, w_q, w_k, v),
    ]
    for fn in fns:
        full = fn(Q, K)
        np.testing.assert_allclose(fn(Q[..., 1:4, :], K[..., 2:5, :]), full[..., 1:4, 2:5], 1e-5)
