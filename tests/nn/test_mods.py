"""Mods in NNX: modules that own their parameters, MultiHeadAttention and ModelConfig."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnjax import mods
from attnjax.nn import ModelConfig, MultiHeadAttention, build
from attnjax.nn.mods import ALiBi, RelativePositionBias

B, T, D, N = 2, 12, 16, 4
X = jax.random.normal(jax.random.key(0), (B, T, D))


def _mha(implementation, score_mod, mask_mod=None):
    return MultiHeadAttention(
        N, D, implementation=implementation, score_mod=score_mod, mask_mod=mask_mod,
        rngs=nnx.Rngs(0),
    )  # fmt: skip


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_relative_position_bias_module_learns_its_table_on_every_implementation(implementation):
    def loss(model):
        return jnp.sum(model(X, is_causal=True) ** 2)

    grads = {}
    for impl in ("xla", implementation):
        model = _mha(impl, RelativePositionBias(N, 8, 16), mods.sliding_window(4))
        model.score_mod.table[...] = jax.random.normal(jax.random.key(1), (N, 8))
        grads[impl] = nnx.grad(loss)(model).score_mod.table[...]
    assert np.abs(grads["xla"]).max() > 1e-3
    np.testing.assert_allclose(grads[implementation], grads["xla"], atol=1e-4)


def test_alibi_module_fixed_equals_the_function_and_learnable_has_a_param():
    fixed = _mha("xla", ALiBi(N))
    plain = _mha("xla", mods.alibi(N))
    np.testing.assert_allclose(fixed(X), plain(X), atol=1e-6)
    learnable = ALiBi(N, learnable=True)
    assert len(jax.tree.leaves(nnx.state(learnable, nnx.Param))) == 1
    assert not jax.tree.leaves(nnx.state(ALiBi(N), nnx.Param))


def test_call_mod_params_carry_per_batch_data():
    ids = jnp.repeat(jnp.array([[0, 1], [0, 0]]), 6, axis=1)
    model = _mha("chunked", None, mods.document())
    out = model(X, mod_params={"document_ids": ids})
    first = _mha("chunked", None)(X[:1, :6])
    np.testing.assert_allclose(out[:1, :6], first, atol=1e-5)


def test_model_config_builds_gallery_mods_and_rejects_unknown_names():
    config = ModelConfig(
        width=D, heads=N, vocab_size=5, score_mod="relative_position_bias",
        relative_buckets=8, mask_mod="sliding_window", mask_mod_size=3, causal=True,
    )  # fmt: skip
    model = build(config, nnx.Rngs(0))
    logits = model({"inputs": jnp.zeros((B, T), jnp.int32)})
    assert logits.shape == (B, T, 2)
    tables = [x for p, x in nnx.iter_graph(model) if isinstance(x, RelativePositionBias)]
    assert tables and tables[0].table.shape == (N, 8)
    with pytest.raises(ValueError, match="score_mod"):
        ModelConfig(vocab_size=5, score_mod="alibii")
    with pytest.raises(ValueError, match="mask_mod"):
        ModelConfig(vocab_size=5, mask_mod="window")
