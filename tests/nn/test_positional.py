import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann


def test_rope_logits_depend_on_relative_position_only():
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 8))
    dots = [
        jnp.sum(ann.rope(q, jnp.array([t])) * ann.rope(k, jnp.array([t - 2]))) for t in (2, 5, 11)
    ]
    np.testing.assert_allclose(dots, dots[0] * np.ones(3), rtol=1e-5)
    np.testing.assert_allclose(ann.rope(q, jnp.array([0])), q)


def test_sinusoidal_values_and_amplitude():
    pe = ann.sinusoidal(jnp.arange(3), 4)
    np.testing.assert_allclose(pe[1], [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)], rtol=1e-6)
    x = jnp.zeros((1, 3, 4))
    np.testing.assert_allclose(ann.Sinusoidal(4, amplitude=5.0)(x)[0], 5.0 * pe, rtol=1e-6)


def test_learned_table_and_length_check():
    learned = ann.Learned(4, 6, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(learned(jnp.zeros((2, 3, 6)))[1], learned.table[...][:3])
    with pytest.raises(ValueError, match="max_len=4"):
        learned(jnp.zeros((1, 5, 6)))
