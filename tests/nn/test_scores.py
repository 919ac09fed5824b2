import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann
from attnjax import scores
from attnjax.nn.scores import qknorm_scale

N, H = 3, 8
Q = jax.random.normal(jax.random.key(0), (2, N, 5, H))
K = jax.random.normal(jax.random.key(1), (2, N, 4, H))
PURE = {
    "dot": scores.dot,
    "scaled_dot": scores.scaled_dot,
    "bilinear": scores.bilinear,
    "additive": scores.additive,
    "additive_relu": functools.partial(scores.additive, activation=jax.nn.relu),
    "cosine": scores.cosine,
}
CASES = [(name, {}) for name in PURE] + [
    ("scaled_dot", {"learnable_scale": True, "init_scale": 0.3}),
    ("additive", {"hidden": 5, "use_bias": False}),
    ("cosine", {"length": 16}),
]


@pytest.mark.parametrize(("name", "options"), CASES)
def test_each_head_matches_the_pure_function(name, options):
    module = ann.make_score(name, N, H, options=options, rngs=nnx.Rngs(0))
    assert module.name == name
    logits = module.logits(Q, K)
    for n in range(N):
        head = {key: value[n] for key, value in module().items()}
        expected = PURE[name](Q[:, n], K[:, n], **head)
        np.testing.assert_allclose(logits[:, n], expected, atol=1e-5, rtol=1e-5)


def test_parameters_are_per_head_and_initialized_as_documented():
    rngs = nnx.Rngs(0)
    assert ann.make_score("scaled_dot", N, H, rngs=rngs)() == {}
    gamma = ann.make_score("scaled_dot", N, H, options={"learnable_scale": True}, rngs=rngs)
    np.testing.assert_allclose(gamma()["scale"], np.full(N, H**-0.5))
    cosine = ann.make_score("cosine", N, H, options={"length": 64}, rngs=rngs)
    np.testing.assert_allclose(cosine()["scale"], np.full(N, np.log2(64 * 63)), rtol=1e-6)
    additive = ann.make_score("additive_relu", N, H, options={"hidden": 6}, rngs=rngs)
    assert {k: v.shape for k, v in additive().items()} == {
        "w_q": (N, H, 6),
        "w_k": (N, H, 6),
        "v": (N, 6),
        "b": (N, 6),
    }


def test_cosine_init_does_not_cap_the_largest_weight():
    length = 32
    logits = jnp.full((length,), -qknorm_scale(length)).at[0].set(qknorm_scale(length))
    assert jax.nn.softmax(logits)[0] > 0.99


def test_a_fixed_cosine_scale_is_not_a_parameter():
    options = {"init_scale": 1.0, "learnable": False}
    fixed = ann.make_score("cosine", N, H, options=options, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(fixed()["scale"], np.ones(N))
    assert not jax.tree.leaves(nnx.state(fixed, nnx.Param))
    config = ann.ModelConfig(score="cosine", cosine_scale=1.0, vocab_size=4)
    assert config.score_options() == {"length": config.max_len, **options}
    with pytest.raises(ValueError, match="cosine_scale"):
        ann.ModelConfig(score="dot", cosine_scale=1.0, vocab_size=4)


def test_bad_names_and_options_are_named():
    with pytest.raises(ValueError, match="score: expected one of"):
        ann.make_score("dott", N, H, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"score_options.*\['hidden'\]"):
        ann.make_score("cosine", N, H, options={"hidden": 3}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="init_scale"):
        ann.make_score("scaled_dot", N, H, options={"init_scale": 1.0}, rngs=nnx.Rngs(0))


def test_additive_bias_init_fills_the_bias():
    module = ann.make_score("additive_relu", N, H, options={"bias_init": 1.0}, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(module()["b"], np.ones((N, H)))
    with pytest.raises(ValueError, match="bias_init"):
        ann.make_score("additive", N, H, options={"use_bias": False, "bias_init": 1.0},
                       rngs=nnx.Rngs(0))  # fmt: skip
