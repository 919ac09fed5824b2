import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann

B, T, S, D = 2, 6, 4, 16
X = jax.random.normal(jax.random.key(0), (B, T, D))
Y = jax.random.normal(jax.random.key(1), (B, S, 8))


def _loaded_pair(num_kv_heads=None, normalize_qk=False, **options):
    """Flax's module and ours (head size 6) built with Flax's positional arguments and
    keywords, Flax's parameters copied into ours (same paths: query, key, value, out,
    query_ln, key_ln)."""
    args = (4, D, 24, 12, num_kv_heads, 8)  # heads, in, qkv, out, kv heads, in_kv
    kw = {"normalize_qk": normalize_qk, **options}
    ref = nnx.MultiHeadAttention(*args, decode=False, rngs=nnx.Rngs(1), **kw)
    ours = ann.MultiHeadAttention(*args, rngs=nnx.Rngs(1), **kw)
    nnx.update(ours, nnx.state(ref, nnx.Param))
    return ours, ref


CALLS = {
    "self, causal mask": ((X,), {"mask": jnp.tril(jnp.ones((T, T), bool))[None, None]}),
    "self, is_causal": ((X,), {"is_causal": True}),
    "cross, k and v separate": ((X, Y, Y * 2.0 - 1.0), {}),
    "cross, v from k, key mask": ((X, Y), {"mask": (jnp.arange(S) < 3)[None, None, None]}),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize(("num_kv_heads", "normalize_qk"), [(None, False), (2, True)])
def test_matches_flax_forward_and_gradients(call, num_kv_heads, normalize_qk):
    ours, ref = _loaded_pair(num_kv_heads, normalize_qk)
    args, kwargs = CALLS[call]
    if len(args) == 1:  # self-attention: both modules read x with in_kv_features = D
        ours, ref = _loaded_pair_self(num_kv_heads, normalize_qk)

    def loss(model, *args):
        return jnp.sum(jnp.sin(model(*args, **kwargs)))

    np.testing.assert_allclose(ours(*args, **kwargs), ref(*args, **kwargs), atol=1e-5, rtol=1e-5)
    g_ours = nnx.grad(loss, argnums=(0, 1))(ours, *args)
    g_ref = nnx.grad(loss, argnums=(0, 1))(ref, *args)
    np.testing.assert_allclose(g_ours[1], g_ref[1], atol=1e-5, rtol=1e-5)
    ref_grads = dict(nnx.to_flat_state(nnx.state(g_ref[0], nnx.Param)))
    for path, value in nnx.to_flat_state(nnx.state(g_ours[0], nnx.Param)):
        if path in ref_grads:  # ours also has score parameters (none for scaled_dot)
            np.testing.assert_allclose(value[...], ref_grads[path][...], atol=1e-5, rtol=1e-5,
                                       err_msg=str(path))  # fmt: skip
    assert set(ref_grads) <= {p for p, _ in nnx.to_flat_state(nnx.state(g_ours[0], nnx.Param))}


def _loaded_pair_self(num_kv_heads, normalize_qk):
    args = (4, D, 24, 12, num_kv_heads)
    kw = {"normalize_qk": normalize_qk}
    ref = nnx.MultiHeadAttention(*args, decode=False, rngs=nnx.Rngs(1), **kw)
    ours = ann.MultiHeadAttention(*args, rngs=nnx.Rngs(1), **kw)
    nnx.update(ours, nnx.state(ref, nnx.Param))
    return ours, ref


def test_flax_dropout_matches_deterministic_and_training():
    """With the same seeds, Flax's module and ours draw the same broadcast dropout mask."""
    ours, ref = (
        cls(4, D, 24, 12, dropout_rate=0.5, rngs=nnx.Rngs(1), **extra)
        for cls, extra in (
            (ann.MultiHeadAttention, {}),
            (nnx.MultiHeadAttention, {"decode": False}),
        )
    )
    nnx.update(ours, nnx.state(ref, nnx.Param))
    for deterministic in (True, False):
        np.testing.assert_allclose(
            ours(X, deterministic=deterministic), ref(X, deterministic=deterministic), atol=1e-5
        )


def test_flax_sown_weights_are_ours():
    ours, ref = _loaded_pair_self(2, False)
    _, sown_ours = nnx.capture(ours, nnx.Intermediate)(X, sow_weights=True)
    _, sown_ref = nnx.capture(ref, nnx.Intermediate)(X, sow_weights=True)
    weights = nnx.to_flat_state(nnx.filter_state(sown_ref, nnx.PathContains("attention_weights")))
    np.testing.assert_allclose(
        jax.tree.leaves(nnx.filter_state(sown_ours, nnx.PathContains("attention_weights")))[0],
        jax.tree.leaves(weights)[0],
        atol=1e-6,
    )


@pytest.mark.parametrize("score", ["scaled_dot", "cosine"])
def test_attention_fn_puts_attnjax_scores_in_flax(score):
    """Flax's module with ``attention_fn=attention_fn(score)`` equals ours with that score,
    dropout included (the same seeds draw the same masks); with the default score it equals
    Flax's own attention."""
    params = {"cosine": {"score_params": {"scale": 5.0}}}.get(score, {})
    options = {"init_scale": 5.0, "learnable": False} if score == "cosine" else None

    def modules():  # each with nnx.Rngs(1) of its own: the same draws
        common = {"dropout_rate": 0.5}
        return (
            nnx.MultiHeadAttention(4, D, 24, decode=False, **common, rngs=nnx.Rngs(1),
                                   attention_fn=ann.attention_fn(score, **params)),
            ann.MultiHeadAttention(4, D, 24, score=score, score_options=options, **common,
                                   rngs=nnx.Rngs(1)),
            nnx.MultiHeadAttention(4, D, 24, decode=False, **common, rngs=nnx.Rngs(1)),
        )  # fmt: skip

    for deterministic in (True, False):
        flax_ours, ours, flax = modules()
        nnx.update(ours, nnx.state(flax_ours, nnx.Param))
        expected = flax_ours(X, deterministic=deterministic)
        np.testing.assert_allclose(ours(X, deterministic=deterministic), expected, atol=1e-5)
        if score == "scaled_dot":
            np.testing.assert_allclose(flax(X, deterministic=deterministic), expected, atol=1e-5)


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
    ungated = mha(X)
    ann.add_head_gates(mha)
    np.testing.assert_array_equal(mha(X), ungated)
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


def test_flax_float_masks_and_flax_decoding_through_attention_fn():
    """Flax builds masks as floats (``make_causal_mask``; ``combine_masks`` while decoding):
    ours and the adapter take them as Flax does."""
    ours, ref = _loaded_pair_self(2, False)
    causal = nnx.make_causal_mask(jnp.ones((B, T)))  # float32 [B, 1, T, T]
    np.testing.assert_allclose(ours(X, mask=causal), ref(X, mask=causal), atol=1e-5)
    flax_ours, flax = (
        nnx.MultiHeadAttention(4, D, 24, decode=True, rngs=nnx.Rngs(1), **extra)
        for extra in ({"attention_fn": ann.attention_fn()}, {})
    )
    for module in (flax_ours, flax):
        module.init_cache(X.shape)
    for t in range(T):
        np.testing.assert_allclose(flax_ours(X[:, t : t + 1]), flax(X[:, t : t + 1]), atol=1e-5)
