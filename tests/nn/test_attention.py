import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann

B, T, S, D = 2, 6, 4, 16
X = jax.random.normal(jax.random.key(0), (B, T, D))
Y = jax.random.normal(jax.random.key(1), (B, S, 8))


def _loaded_pair(num_kv_heads, qk_norm=False):
    """Our module and flax's (head size 6), with our weights copied into flax's."""
    kw = {"qkv_features": 24, "out_features": 12, "num_kv_heads": num_kv_heads}
    ours = ann.MultiHeadAttention(4, D, qk_norm=qk_norm, rngs=nnx.Rngs(0), **kw)
    ref = nnx.MultiHeadAttention(
        4,
        D,
        **kw,
        normalize_qk=qk_norm,
        decode=False,
        rngs=nnx.Rngs(1),
    )
    for name in ("query", "key", "value", "out"):
        getattr(ref, name).kernel[...] = getattr(ours, name).kernel[...]
        getattr(ref, name).bias[...] = getattr(ours, name).bias[...]
    return ours, ref


@pytest.mark.parametrize(("num_kv_heads", "qk_norm"), [(None, False), (2, True)])
def test_matches_flax_forward_and_gradients(num_kv_heads, qk_norm):
    ours, ref = _loaded_pair(num_kv_heads, qk_norm)
    mask = jnp.tril(jnp.ones((T, T), bool))[None, None]

    def loss(model, x):
        return jnp.sum(jnp.sin(model(x, mask=mask)))

    out = ours(X, mask=mask)
    np.testing.assert_allclose(out, ref(X, mask=mask), atol=1e-5, rtol=1e-5)
    g_ours = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(ours, X)
    g_ref = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(ref, X)
    np.testing.assert_allclose(g_ours[1], g_ref[1], atol=1e-5, rtol=1e-5)
    for name in ("query", "key", "value", "out"):
        for p in ("kernel", "bias"):
            a = getattr(getattr(g_ours[0], name), p)[...]
            b = getattr(getattr(g_ref[0], name), p)[...]
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"{name}.{p}")
    if qk_norm:
        np.testing.assert_allclose(
            g_ours[0].key_norm.scale[...], g_ref[0].key_ln.scale[...], atol=1e-5, rtol=1e-5
        )


def test_permutation_equivariant_without_positions():
    mha = ann.MultiHeadAttention(4, D, score="additive", rngs=nnx.Rngs(0))
    perm = jnp.array([3, 0, 5, 1, 4, 2])
    np.testing.assert_allclose(mha(X)[:, perm], mha(X[:, perm]), atol=1e-5)


def test_causal_output_ignores_the_future():
    mha = ann.MultiHeadAttention(4, D, rope=True, rngs=nnx.Rngs(0))
    changed = X.at[:, 4:].set(7.0)
    np.testing.assert_allclose(mha(X, is_causal=True)[:, :4], mha(changed, is_causal=True)[:, :4])


def test_padding_keys_are_ignored():
    mha = ann.MultiHeadAttention(4, D, num_kv_heads=1, score="cosine", rngs=nnx.Rngs(0))
    mask = (jnp.arange(T) < 4)[None, None, None, :]
    changed = X.at[:, 4:].set(-3.0)
    np.testing.assert_allclose(mha(X, mask=mask)[:, :4], mha(changed, mask=mask)[:, :4], atol=1e-6)


def test_cross_attention_with_other_lengths_and_features():
    mha = ann.MultiHeadAttention(
        4, D, in_kv_features=8, num_kv_heads=2, rope=True, rngs=nnx.Rngs(0)
    )
    out, weights = mha(X, Y, return_weights=True)
    assert out.shape == (B, T, D) and weights.shape == (B, 4, T, S)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    ("num_kv_heads", "kv_params"),
    [(None, 2 * (16 * 16 + 16)), (2, 2 * (16 * 8 + 8)), (1, 2 * (16 * 4 + 4))],
)
def test_grouped_and_multi_query_parameter_counts(num_kv_heads, kv_params):
    mha = ann.MultiHeadAttention(4, D, num_kv_heads=num_kv_heads, rngs=nnx.Rngs(0))
    counts = {
        n: sum(x.size for x in jax.tree.leaves(nnx.state(getattr(mha, n))))
        for n in ("key", "value")
    }
    assert counts["key"] + counts["value"] == kv_params


def test_bad_head_counts_are_named():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ann.MultiHeadAttention(4, D, num_kv_heads=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_heads"):
        ann.MultiHeadAttention(3, D, rngs=nnx.Rngs(0))


def test_output_norm_at_init_does_not_depend_on_head_count():
    x = jax.random.normal(jax.random.key(2), (32, 8, 32))
    norms = []
    for heads in (1, 2, 4, 8):
        modules = [ann.MultiHeadAttention(heads, 32, rngs=nnx.Rngs(s)) for s in range(4)]
        norm = nnx.jit(lambda mha: jnp.linalg.norm(mha(x), axis=-1).mean())
        per_seed = [norm(mha) for mha in modules]
        norms.append(float(np.mean(per_seed)))
    assert max(norms) / min(norms) < 1.15, norms


def test_weights_agree_with_output_and_can_be_sown():
    mha = ann.MultiHeadAttention(4, D, sow_weights=True, rngs=nnx.Rngs(0))
    call = nnx.capture(lambda m, x: m(x, return_weights=True), nnx.Intermediate)
    (out, weights), sown = call(mha, X)
    np.testing.assert_array_equal(sown["attention_weights"].get_value()[0], weights)
    mha.sow_weights = False
    np.testing.assert_allclose(out, mha(X), atol=1e-6)


def test_zero_gate_prunes_the_head_and_gate_gradient_is_available():
    mha = ann.MultiHeadAttention(4, D, rngs=nnx.Rngs(0))
    mha.gate[...] = jnp.array([1.0, 0.0, 1.0, 1.0])
    pruned = mha(X)
    mha.gate[...] = jnp.ones(4)
    mha.out.kernel[...] = mha.out.kernel[...].at[1].set(0.0)
    np.testing.assert_allclose(pruned, mha(X), atol=1e-6)

    grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2), argnums=nnx.DiffState(0, ann.HeadGate))(mha)
    gate_grad = grads.gate[...]
    assert (
        gate_grad.shape == (4,)
        and gate_grad[1] == 0.0
        and jnp.all(gate_grad[jnp.array([0, 2, 3])] != 0)
    )


def test_dropout_on_weights_and_refusal_off_the_dense_path():
    mha = ann.MultiHeadAttention(4, D, dropout_rate=0.5, rngs=nnx.Rngs(0))
    assert not np.allclose(mha(X), mha(X, deterministic=True))
    mha.eval()
    np.testing.assert_allclose(mha(X), mha(X, deterministic=True))
    tiled = ann.MultiHeadAttention(
        4, D, dropout_rate=0.5, implementation="chunked", rngs=nnx.Rngs(0)
    )
    with pytest.raises(ValueError, match=r"dropout_rate.*chunked"):
        tiled(X)


def test_bfloat16_computation_keeps_float32_softmax():
    mha = ann.MultiHeadAttention(4, D, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    out, weights = mha(X, return_weights=True)
    assert out.dtype == jnp.bfloat16 and weights.dtype == jnp.float32
    ref = ann.MultiHeadAttention(4, D, rngs=nnx.Rngs(0))(X)
    np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=0.1)
