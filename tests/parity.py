"""Parity helpers: one implementation of ``attention`` against the dense reference.

``run`` returns the output, the log-sum-exp and the gradients of a fixed random projection of
both with respect to ``query``, ``key``, ``value`` and the differentiable keyword arguments
(``bias``, ``temperature``, ``score_params``).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import attnjax as aj

FP32_FWD, FP32_GRAD = 1e-5, 1e-4
# bfloat16 inputs keep 8 mantissa bits: the output is rounded to bf16 (relative 2^-8 = 0.4%)
# and tiled and dense paths sum in different orders: 2e-2 relative to the largest entry.
BF16_TOL = 2e-2


def qkv(seed, batch, num_q, num_k, heads, kv_heads, head_dim, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (batch, num_q, heads, head_dim), dtype),
        jax.random.normal(kk, (batch, num_k, kv_heads, head_dim), dtype),
        jax.random.normal(kv, (batch, num_k, kv_heads, head_dim), dtype),
    )


def run(implementation, q, k, v, diff=None, **fixed):
    """``(output, lse, grads)`` of ``attention(q, k, v, **diff, **fixed)``."""
    arrays = {n: x for n, x in fixed.items() if isinstance(x, jax.Array)}
    static = tuple(sorted((n, x) for n, x in fixed.items() if n not in arrays))
    return _compiled(implementation, static)(q, k, v, diff or {}, arrays)


@functools.cache
def _compiled(implementation, static):
    def loss(q, k, v, diff, arrays):
        out, lse = aj.attention(
            q,
            k,
            v,
            implementation=implementation,
            return_lse=True,
            **diff,
            **arrays,
            **dict(static),
        )
        w_out = jax.random.normal(jax.random.key(7), out.shape)
        w_lse = jax.random.normal(jax.random.key(8), lse.shape)
        finite_lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
        value = jnp.sum(out.astype(jnp.float32) * w_out) + jnp.sum(finite_lse * w_lse)
        return value, (out, lse)

    def f(q, k, v, diff, arrays):
        grads, (out, lse) = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
            q, k, v, diff, arrays
        )
        return out, lse, grads

    return jax.jit(f)


def max_rel_error(actual, expected):
    """Largest absolute difference over the largest magnitude (at least 1), per pytree."""

    def one(a, e):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        both_inf = np.isneginf(a) & np.isneginf(e)
        a, e = np.where(both_inf, 0, a), np.where(both_inf, 0, e)
        return float(np.max(np.abs(a - e), initial=0) / max(1.0, np.max(np.abs(e), initial=0)))

    return max(jax.tree.leaves(jax.tree.map(one, actual, expected)), default=0.0)


def assert_matches(implementation, q, k, v, diff=None, fwd_tol=None, grad_tol=None, **fixed):
    """Forward (output, lse) and gradients of ``implementation`` match ``"xla"``."""
    bf16 = q.dtype == jnp.bfloat16
    fwd_tol = fwd_tol or (BF16_TOL if bf16 else FP32_FWD)
    grad_tol = grad_tol or (BF16_TOL if bf16 else FP32_GRAD)
    expected = run("xla", q, k, v, diff, **fixed)
    actual = run(implementation, q, k, v, diff, **fixed)
    for name, a, e in zip(("output", "lse"), actual[:2], expected[:2], strict=True):
        assert np.all(np.isfinite(a) == np.isfinite(e)), f"{name}: -inf pattern differs"
        err = max_rel_error(a, e)
        assert err <= fwd_tol, f"{name}: max relative error {err:.2e} > {fwd_tol:.0e}"
    for a in jax.tree.leaves(actual[2]):
        assert np.all(np.isfinite(np.asarray(a, np.float32))), "non-finite gradient"
    err = max_rel_error(actual[2], expected[2])
    assert err <= grad_tol, f"gradients: max relative error {err:.2e} > {grad_tol:.0e}"
    return actual
