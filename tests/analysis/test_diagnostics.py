import jax
import jax.numpy as jnp
import numpy as np

import attnjax as aj
from attnjax import analysis

UNIFORM = jnp.full((2, 3, 8), 1 / 8)
ONE_HOT = jax.nn.one_hot(jnp.array([[1, 4, 7], [0, 0, 2]]), 8)


def test_entropy_uniform_one_hot_and_empty_rows():
    np.testing.assert_allclose(analysis.entropy(UNIFORM), np.log(8), rtol=1e-6)
    np.testing.assert_array_equal(analysis.entropy(ONE_HOT), 0.0)
    assert analysis.entropy(jnp.zeros((1, 8)))[0] == 0.0


def test_max_logit_and_saturation():
    assert analysis.max_logit(jnp.array([[1.0, -3.0], [7.5, 2.0]])) == 7.5
    rows = jnp.array([[0.995, 0.005], [0.5, 0.5], [1.0, 0.0], [0.9, 0.1]])
    assert analysis.saturation(rows) == 0.5


def test_max_logit_from_softmax_by_hand_and_through_attention():
    # logits [0, log 3] -> w [1/4, 3/4], lse log 4; [2, 2] -> w [1/2, 1/2], lse 2 + log 2;
    # a row with no visible key (w 0, lse -inf) is ignored: max(log 3, 2) = 2.
    weights = jnp.array([[0.25, 0.75], [0.5, 0.5], [0.0, 0.0]])
    lse = jnp.array([np.log(4.0), 2 + np.log(2.0), -np.inf])
    np.testing.assert_allclose(analysis.max_logit_from_softmax(weights, lse), 2.0, rtol=1e-6)
    np.testing.assert_allclose(
        analysis.max_logit_from_softmax(weights[:1], lse[:1]), np.log(3.0), rtol=1e-6
    )
    assert analysis.max_logit_from_softmax(weights[2:], lse[2:]) == -np.inf
    q, k, v = jax.random.normal(jax.random.key(0), (3, 6, 2, 4)) * 30  # logits in the hundreds
    _, w, lse = aj.attention(q, k, v, score="dot", is_causal=True, return_weights=True,
                             return_lse=True, implementation="xla")  # fmt: skip
    logits = jnp.where(jnp.tril(jnp.ones((6, 6), bool)), jnp.einsum("tnh,snh->nts", q, k), -1e9)
    np.testing.assert_allclose(analysis.max_logit_from_softmax(w, lse), logits.max(), rtol=1e-5)


def test_softmax_jacobian_norm_matches_jax_jacobian():
    logits = jax.random.normal(jax.random.key(0), (4, 6)) * 2
    for row in logits:
        jac = jax.jacobian(jax.nn.softmax)(row)
        np.testing.assert_allclose(
            analysis.softmax_jacobian_norm(jax.nn.softmax(row)), jnp.linalg.norm(jac), rtol=1e-5
        )
    np.testing.assert_allclose(analysis.softmax_jacobian_norm(ONE_HOT), 0.0, atol=1e-7)


def test_head_similarity_identical_and_disjoint_heads():
    a = jax.nn.one_hot(jnp.array([[0, 1], [2, 3]]), 4)  # head 0 and head 1: disjoint keys
    maps = jnp.stack([a[0], a[0], a[1]])[None]  # [B=1, N=3, T=2, S=4]
    sim = analysis.head_similarity(maps)
    np.testing.assert_allclose(sim, [[1, 1, 0], [1, 1, 0], [0, 0, 1]], atol=1e-6)


def test_effective_rank_of_identity_and_rank_one():
    np.testing.assert_allclose(analysis.effective_rank(jnp.eye(5)), 5.0, rtol=1e-5)
    np.testing.assert_allclose(analysis.effective_rank(UNIFORM[0]), 1.0, rtol=1e-4)


def test_gradient_norm_by_position_linear_map_and_causal_attention():
    w = jax.random.normal(jax.random.key(1), (4, 3))
    norms = analysis.gradient_norm_by_position(lambda x: x @ w, jnp.ones((6, 4)), 2)
    np.testing.assert_allclose(norms, np.eye(6)[2] * float(jnp.linalg.norm(w)), rtol=1e-5)

    def causal_self_attention(x):  # [T, D] -> [T, D], one head
        h = x[:, None, :]
        return aj.attention(h, h, h, is_causal=True)[:, 0, :]

    x = jax.random.normal(jax.random.key(2), (6, 4))
    norms = analysis.gradient_norm_by_position(causal_self_attention, x, 3)
    assert (norms[:4] > 0).all() and (norms[4:] == 0).all()


def test_cosine_weight_bound_is_exact():
    """Cosine logits with scale g never give a key more than e^{2g}/(e^{2g}+n−1) (0.105 for
    g = 1, n = 64): random directions stay below it, the extreme configuration reaches it, and
    gradient ascent on the keys cannot pass it."""
    n, h, g = 64, 8, 1.0
    bound = float(analysis.cosine_weight_bound(g, n))
    assert abs(bound - np.exp(2) / (np.exp(2) + 63)) < 1e-7 and abs(bound - 0.105) < 1e-3
    q = jax.random.normal(jax.random.key(0), (256, 1, h))
    k = jax.random.normal(jax.random.key(1), (256, n, h))

    def top_weight(q, k):
        logits = aj.scores.cosine(q, k, g)
        return jax.nn.softmax(logits, axis=-1)[..., 0, 0]

    assert float(top_weight(q, k).max()) < bound
    extreme = jnp.concatenate([q, jnp.repeat(-q, n - 1, axis=1)], axis=1)
    np.testing.assert_allclose(top_weight(q, extreme), bound, rtol=1e-5)
    ascend = jax.jit(jax.grad(lambda k: jnp.log(top_weight(q, k)).sum()))
    for _ in range(100):  # projected onto the unit sphere: cosine ignores the norm
        k = k + 20.0 * ascend(k)
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    reached = top_weight(q, k)
    assert float(reached.max()) <= bound * (1 + 1e-5) and float(reached.mean()) > 0.75 * bound
