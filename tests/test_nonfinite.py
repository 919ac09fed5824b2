"""Non-finite values on every implementation, as in ``jax.nn``: a NaN or ``+inf`` among a
row's visible logits gives a NaN row (forward and gradients); a row whose logits are all
``-inf`` counts as a row with no visible key (output 0, zero gradients, log-sum-exp ``-inf``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from tests.parity import qkv

IMPLEMENTATIONS = ["xla", "chunked", "pallas"]
TILES = aj.BlockSizes(4, 4)  # T = S = 10: padded tiles on both axes
Q, K, V = qkv(0, 1, 10, 10, 2, 2, 4)
CASES = {
    "nan_in_query": ((Q.at[0, 3, 0, 1].set(jnp.nan), K, V), {}),
    "nan_in_query_causal": ((Q.at[0, 3, 0, 1].set(jnp.nan), K, V), {"is_causal": True}),
    "inf_in_key_causal": ((Q, K.at[0, 2, 0, :].set(jnp.inf), V), {"is_causal": True}),
    "nan_in_key_window": ((Q, K.at[0, 5, 1, 0].set(jnp.nan), V), {"local_window_size": 1}),
    "nan_in_value": ((Q, K, V.at[0, 6, 0, 2].set(jnp.nan)), {}),
}


def _attention(implementation, **kwargs):
    tiles = None if implementation == "xla" else TILES
    return lambda q, k, v: aj.attention(
        q, k, v, implementation=implementation, block_sizes=tiles, **kwargs
    )


def _grads(fn, q, k, v):
    return jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_nan_and_inf_give_the_rows_jax_nn_gives(implementation, case):
    (q, k, v), kwargs = CASES[case]
    ref = jax.nn.dot_product_attention(q, k, v, **kwargs)
    out = _attention(implementation, **kwargs)(q, k, v)
    assert jnp.isnan(ref).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
@pytest.mark.parametrize("case", CASES)
def test_nan_gradients_reach_what_the_nan_rows_see(implementation, case):
    """Each gradient holds NaN exactly when the dense path's does, NaN at every entry a NaN
    row reaches (the entries the dense and the tiled gradients both call NaN cover the
    dense path's NaN entries of ``q``), and equal values where both are finite. Which other
    entries turn NaN through ``0 · NaN`` products with masked entries differs between
    implementations (``jax.nn`` too: its masked weights of a NaN row are NaN)."""
    (q, k, v), kwargs = CASES[case]
    dense = _grads(_attention("xla", **kwargs), q, k, v)
    tiled = _grads(_attention(implementation, **kwargs), q, k, v)
    reference = _grads(lambda *a: jax.nn.dot_product_attention(*a, **kwargs), q, k, v)
    for got, ref in zip(dense, reference, strict=True):  # the dense path is jax.nn's
        np.testing.assert_array_equal(jnp.isnan(got), jnp.isnan(ref))
        np.testing.assert_allclose(got, ref, atol=1e-5, equal_nan=True)
    for got, ref in zip(tiled, dense, strict=True):
        assert jnp.isnan(got).any() == jnp.isnan(ref).any()
        finite = ~jnp.isnan(got) & ~jnp.isnan(ref)
        np.testing.assert_allclose(got[finite], ref[finite], atol=1e-4)
    assert not (jnp.isnan(dense[0]) & ~jnp.isnan(tiled[0])).any()


def _minus_inf_rows(logits, b, h, q_idx, kv_idx, params):
    return jnp.where(q_idx % 3 == 0, -jnp.inf, logits)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_row_of_minus_inf_logits_is_an_empty_row_everywhere(implementation):
    """A ``score_mod`` that sets whole rows to ``-inf`` masks them, on every implementation
    alike (``jax.nn`` gives NaN rows for ``-inf`` logits; attnjax's empty-row convention)."""
    fn = _attention(implementation, score_mod=_minus_inf_rows, return_lse=True)
    (out, lse), vjp = jax.vjp(fn, Q, K, V)
    rows = np.arange(10) % 3 == 0
    np.testing.assert_array_equal(out[0, rows], 0.0)
    assert np.all(lse[0][:, rows] == -np.inf) and np.isfinite(lse[0][:, ~rows]).all()
    dq, dk, dv = vjp((jnp.ones_like(out), jnp.zeros_like(lse)))
    np.testing.assert_array_equal(dq[0, rows], 0.0)
    assert all(jnp.isfinite(g).all() for g in (dq, dk, dv))
    visible = jnp.broadcast_to(~rows[:, None], (10, 10))
    masked = aj.attention(Q, K, V, mask=visible, implementation="xla")
    np.testing.assert_allclose(out, masked, atol=1e-5)


def _key_padding_mod(logits, b, h, q_idx, kv_idx, params):
    """Finite on real keys only: ``sqrt`` of a negative past the last key."""
    return logits - params["c"] * jnp.sqrt((9 - kv_idx).astype(jnp.float32))


def _query_padding_mod(logits, b, h, q_idx, kv_idx, params):
    """Finite on real queries only."""
    return logits + 0.1 * params["c"] * jnp.sqrt((9 - q_idx).astype(jnp.float32))


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
@pytest.mark.parametrize("mod", [_key_padding_mod, _query_padding_mod])
def test_mods_never_see_the_padding_of_tiles(implementation, mod):
    """T = S = 10 in 4 x 4 tiles: positions 10 and 11 are padding. A mod finite on every
    real position gives the dense path's gradients (they were NaN)."""

    def grads(impl):
        def loss(q, k, v, c):
            fn = _attention(impl, score_mod=mod, mod_params={"c": c}, is_causal=True)
            return jnp.sum(jnp.sin(fn(q, k, v)))

        return jax.grad(loss, argnums=(0, 1, 2, 3))(Q, K, V, jnp.float32(0.5))

    for got, ref in zip(grads(implementation), grads("xla"), strict=True):
        assert jnp.isfinite(got).all()
        np.testing.assert_allclose(got, ref, atol=1e-4)


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_a_nan_value_no_row_sees_reaches_only_the_tiles_that_hold_it(implementation):
    """Causal, NaN in the value of the last key: ``jax.nn`` and xla multiply it by the zero
    weight of every row (``0 · NaN``: all rows NaN); the tiled paths give NaN to the rows
    whose tiles hold that key (the rows that see it, and the others of their query tile),
    and every other row its finite value (documented in docs/tiled.md)."""
    v = V.at[0, 9, 0, 0].set(jnp.nan)
    dense = _attention("xla", is_causal=True)(Q, K, v)
    tiled = _attention(implementation, is_causal=True)(Q, K, v)
    assert jnp.isnan(dense[0, :, 0, 0]).all()
    np.testing.assert_array_equal(jnp.isnan(tiled[0, :, 0, 0]), np.arange(10) >= 8)
    clean = _attention("xla", is_causal=True)(Q, K, V)
    np.testing.assert_allclose(tiled[0, :8], clean[0, :8], atol=1e-5)
