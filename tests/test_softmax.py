import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax import masked_softmax, masked_softmax_with_lse
from attnjax.pallas.tpu import LaneStats
from attnjax.softmax import MASK_VALUE, RowStats, online_finish, online_init, online_step
from tests.parity import max_rel_error

LOGITS = jax.random.normal(jax.random.key(0), (3, 5, 7)) * 3


def test_matches_jax_softmax_and_logsumexp_without_mask():
    w, lse = masked_softmax_with_lse(LOGITS)
    np.testing.assert_allclose(w, jax.nn.softmax(LOGITS), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse, jax.nn.logsumexp(LOGITS, axis=-1), rtol=1e-6)


def test_jacobian_is_diag_y_minus_y_yt():
    x = LOGITS[0, 0]
    y = masked_softmax(x)
    jac = jax.jacobian(masked_softmax)(x)
    np.testing.assert_allclose(jac, jnp.diag(y) - jnp.outer(y, y), atol=1e-6)


def test_invariant_to_per_row_constant():
    logits = jnp.round(LOGITS * 64) / 64  # on a grid where adding the shifts is exact
    shift = jnp.array([1e3, -50.0, 7.0])[:, None, None]
    np.testing.assert_allclose(masked_softmax(logits + shift), masked_softmax(logits), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("magnitude", [1e4, 1e30, 3e38])
def test_extreme_logits_give_finite_weights_and_gradients(dtype, magnitude):
    if dtype == jnp.bfloat16 and magnitude > 3e38:
        pytest.skip("beyond bfloat16's range")
    x = jnp.array([[magnitude, -magnitude, 0.0, magnitude / 2]], dtype)
    w = masked_softmax(x)
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(w, [[1.0, 0.0, 0.0, 0.0]], atol=1e-6)
    grad = jax.grad(lambda x: (masked_softmax(x) * jnp.arange(4.0)[None]).sum())(
        x.astype(jnp.float32)
    )
    assert np.all(np.isfinite(grad))


def test_masked_entries_get_zero_weight():
    mask = jnp.array([True, False, True, False, True, True, False])
    w = masked_softmax(LOGITS, mask)
    np.testing.assert_array_equal(w[..., ~mask], 0.0)
    np.testing.assert_allclose(w[..., mask], jax.nn.softmax(LOGITS[..., mask]), rtol=1e-6)


def test_fully_masked_row_gives_zero_weights_zero_gradient_and_minus_inf_lse():
    mask = jnp.ones((3, 5, 7), bool).at[1, 2].set(False)

    def loss(x):
        w, _ = masked_softmax_with_lse(x, mask)
        return (w * jnp.arange(7.0)[None, None]).sum()

    w, lse = masked_softmax_with_lse(LOGITS, mask)
    np.testing.assert_array_equal(w[1, 2], 0.0)
    assert lse[1, 2] == -jnp.inf and np.isfinite(np.delete(lse.ravel(), 7)).all()
    grad = jax.grad(loss)(LOGITS)
    np.testing.assert_array_equal(grad[1, 2], 0.0)
    assert np.all(np.isfinite(grad))


def test_online_softmax_same_with_lane_replicated_row_statistics():
    """The TPU kernel's layout (row statistics replicated over 128 lanes) and one statistic per
    row give the softmax's output and log-sum-exp over two tiles, empty rows included."""
    logits = 5 * jax.random.normal(jax.random.key(0), (8, 256))
    values = jax.random.normal(jax.random.key(1), (256, 128))
    lengths = jnp.array([0, 1, 100, 128, 129, 200, 256, 256])
    mask = jnp.arange(256)[None] < lengths[:, None]
    weights, expected_lse = masked_softmax_with_lse(logits, mask)
    lanes = (jnp.full((8, 128), MASK_VALUE), jnp.zeros((8, 128)), jnp.zeros((8, 128)))
    for stats, carry in ((RowStats, online_init((8,), 128)), (LaneStats, lanes)):
        for tile in (slice(0, 128), slice(128, 256)):
            weighted_sum = lambda p, tile=tile: p @ values[tile]  # noqa: E731
            carry = online_step(carry, logits[:, tile], mask[:, tile], weighted_sum, stats)
        out, lse = online_finish(carry, stats)
        lse = jnp.broadcast_to(lse.reshape(8, -1), (8, 128))
        assert max_rel_error(out, weights @ values) <= 1e-5
        assert max_rel_error(lse, jnp.broadcast_to(expected_lse[:, None], (8, 128))) <= 1e-6
