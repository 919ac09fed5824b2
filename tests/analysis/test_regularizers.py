import itertools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax import analysis

MAPS = jax.nn.softmax(jax.random.normal(jax.random.key(0), (2, 3, 4, 5)) * 2, -1)


def test_cosine_penalty_matches_hand_written_reference():
    n = MAPS.shape[1]
    flat = np.asarray(MAPS).transpose(1, 0, 2, 3).reshape(n, -1)
    pairs = [
        flat[i] @ flat[j] / np.linalg.norm(flat[i]) / np.linalg.norm(flat[j])
        for i, j in itertools.permutations(range(n), 2)
    ]
    np.testing.assert_allclose(analysis.cosine_diversity_penalty(MAPS), np.mean(pairs), rtol=1e-5)


def test_orthogonality_penalty_matches_loops_and_is_zero_for_orthogonal_maps():
    a = np.asarray(MAPS)
    expected = np.mean(
        [
            sum(np.sum((a[b, i] @ a[b, j].T) ** 2) for i, j in itertools.permutations(range(3), 2))
            for b in range(2)
        ]
    )
    np.testing.assert_allclose(analysis.orthogonality_penalty(MAPS), expected, rtol=1e-5)
    orthogonal = jax.nn.one_hot(jnp.array([[0, 1], [2, 3], [4, 4]]), 5)[None]  # [1, 3, 2, 5]
    value, grad = jax.value_and_grad(analysis.orthogonality_penalty)(orthogonal)
    assert value == 0.0
    np.testing.assert_array_equal(grad, 0.0)


def test_penalties_are_finite_for_empty_and_single_head_maps():
    zeros = jnp.zeros((1, 2, 3, 4))
    for penalty in (analysis.cosine_diversity_penalty, analysis.orthogonality_penalty):
        value, grad = jax.value_and_grad(penalty)(zeros)
        assert np.isfinite(value) and np.isfinite(grad).all()
    assert analysis.cosine_diversity_penalty(MAPS[:, :1]) == 0.0


def test_z_loss_formula():
    logits = jnp.array([[0.0, 0.0], [1.0, 3.0]])
    lse = np.log([2.0, np.exp(1) + np.exp(3)])
    np.testing.assert_allclose(analysis.z_loss(logits), 1e-4 * np.mean(lse**2), rtol=1e-6)
