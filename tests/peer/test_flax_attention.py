"""Flax's own NNX attention tests, run against attnjax.

Ported from ``tests/nnx/nn/attention_test.py`` of https://github.com/google/flax (commit
18f8f311c275d57f46d95e41b15aa97b454754c0), Copyright 2024 The Flax Authors, licensed under the
Apache License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0); rewritten here in
pytest with parametrize.

The substitution: every upstream case runs with :class:`attnjax.nn.MultiHeadAttention` in place
of ``nnx.MultiHeadAttention`` and with :func:`attnjax.nn.attention_fn` in place of
``nnx.dot_product_attention``. Each module case runs on these variants:

* ``ours``: our module with ``implementation=None``; ``ours-<impl>``: with
  ``implementation=<impl>`` for ``impl`` in ``("xla", "chunked", "pallas")``;
* ``flax-fn-<impl>``: Flax's own module with
  ``attention_fn=attnjax.nn.attention_fn(implementation=<impl>)``.

Where upstream only checks shapes, the port also compares the outputs with Flax's module (or
``nnx.dot_product_attention``, ``jax.nn.dot_product_attention``, Linen's module) holding the
same weights: Flax's parameters are copied into ours with ``nnx.update(ours, nnx.state(ref,
nnx.Param))`` (the paths are the same: ``query``/``key``/``value``/``out`` kernels and biases,
``query_ln``/``key_ln`` scales).

Documented limits, marked ``xfail(strict=True)`` rather than skipped: Flax's module passes a
dense boolean mask to its ``attention_fn`` while decoding, and ``implementation="pallas"``
refuses dense boolean masks (``attnjax.pallas``: "use chunked"); active dropout needs the dense
path, so ``MultiHeadAttention(implementation=<tiled>)`` raises while dropout is on. One
documented convention differs from Flax: a query row with no visible key gives 0 in attnjax
(``jax.nn``: the mean of the values); comparisons with Flax hold on rows with a visible key and
check attnjax's zeros elsewhere.

Departures from upstream, none of substance: module calls run under ``nnx.jit`` (``apply``:
one compilation per case instead of one per eager operation; caches and rng counts are written
back as eagerly); Linen's and Flax's outputs are compared within rounding of the dtype, not
bit for bit; shape errors are ``ValueError`` with attnjax's wording, or, under the suite's
jaxtyping runtime checks, the ``TypeCheckError`` that names the argument (the project's
convention); Linen's product of upstream's options runs on ``ours`` with precisions
``DEFAULT`` and ``HIGHEST`` (upstream also has ``HIGH``; XLA on CPU computes float32 products
the same at every precision), the other variants take its float32 ``DEFAULT`` slice.

Beyond upstream, the last section checks the rest of the drop-in contract that Flax's module
documents: leading batch dimensions (none or two; one is every case above) in the forward pass
and in decoding, dropout drawing Flax's masks from the same seeds, every constructor and call
argument of Flax's signature, ``nnx.view`` (``set_view``) and Flax's default initialization.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from flax import linen, nnx
from flax.nnx.nn.attention import combine_masks
from jax import enable_x64
from jax.lax import Precision

import attnjax.nn as ann

IMPLS = ("xla", "chunked", "pallas")
VARIANTS = ("ours", *(f"ours-{i}" for i in IMPLS), *(f"flax-fn-{i}" for i in IMPLS))
PALLAS_MASK = pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="Flax's decoding hands attention_fn a dense boolean mask, which "
    "implementation='pallas' refuses (documented: use 'chunked')",
)


def build(variant: str, *args, **kwargs):
    """The module under test for ``variant`` (see the module docstring)."""
    if variant.startswith("flax-fn-"):
        impl = variant.removeprefix("flax-fn-")
        return nnx.MultiHeadAttention(
            *args, attention_fn=ann.attention_fn(implementation=impl), **kwargs
        )
    impl = None if variant == "ours" else variant.removeprefix("ours-")
    return ann.MultiHeadAttention(*args, implementation=impl, **kwargs)


def with_flax_weights(variant: str, *args, seed: int, **kwargs):
    """``(module under test, Flax's module)`` built alike, each from ``nnx.Rngs(seed)`` of its
    own (the same dropout streams), Flax's parameters in both."""
    ref = nnx.MultiHeadAttention(*args, **kwargs, rngs=nnx.Rngs(seed))
    module = build(variant, *args, **kwargs, rngs=nnx.Rngs(seed))
    nnx.update(module, nnx.state(ref, nnx.Param))
    return module, ref


@functools.partial(nnx.jit, static_argnames=("decode", "is_causal", "deterministic"))
def apply(module, *args, **kwargs):
    """``module(*args, **kwargs)`` as one compiled program (caches and rng counts are written
    back): far fewer compilations than running every operation eagerly."""
    return module(*args, **kwargs)


def close(actual, expected, atol=1e-5, rtol=1e-5):
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=atol, rtol=rtol
    )


def variants(*, pallas_decoding: bool = False):
    """VARIANTS as parameters; ``pallas_decoding``: Flax's decoding on the Pallas adapter is
    the documented refusal above."""
    marks = {"flax-fn-pallas": PALLAS_MASK} if pallas_decoding else {}
    return [pytest.param(v, marks=marks.get(v, ())) for v in VARIANTS]


# ---------------------------------------------------------------- TestMultiHeadAttention


@pytest.mark.parametrize("variant", VARIANTS)
def test_basic(variant):
    kw = {"num_heads": 2, "in_features": 3, "qkv_features": 6, "out_features": 6}
    module, ref = with_flax_weights(variant, **kw, seed=0)
    x = jax.random.normal(jax.random.key(0), (1, 7, 3))
    y = apply(module, x, decode=False)
    assert y.shape == (1, 7, 6)
    close(y, apply(ref, x, decode=False))


class _Layers(nnx.Module):
    """Upstream's three stacked layers, sowing from the first and the last."""

    def __init__(self, make):
        self.attention_layers = nnx.data([make() for _ in range(3)])

    def __call__(self, x, sow_weights=False):
        x = self.attention_layers[0](x, sow_weights=sow_weights)
        x = self.attention_layers[1](x)
        return self.attention_layers[2](x, sow_weights=sow_weights)


@pytest.mark.parametrize("variant", VARIANTS)
def test_multihead_sow_attention_weights(variant):
    """Sowing runs on the dense path whatever the implementation (ours and the adapter)."""
    kw = {
        "in_features": 8,
        "num_heads": 8,
        "kernel_init": nnx.initializers.ones_init(),
        "bias_init": nnx.initializers.zeros_init(),
        "deterministic": False,
    }
    rng = nnx.Rngs(0)
    module = _Layers(lambda: build(variant, **kw, rngs=rng))
    ref = _Layers(lambda: nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(0)))
    module.set_attributes(decode=False)
    ref.set_attributes(decode=False)
    x = jax.random.normal(jax.random.key(0), (4, 6, 8))

    y, intermediates = nnx.capture(module, nnx.Intermediate)(x, True)
    y_ref, intermediates_ref = nnx.capture(ref, nnx.Intermediate)(x, True)
    layers = intermediates["attention_layers"]
    assert layers[0]["attention_weights"][0].shape == (4, 8, 6, 6)
    assert 1 not in layers
    assert layers[2]["attention_weights"][0].shape == (4, 8, 6, 6)
    close(y, y_ref)
    for i in (0, 2):
        ref_weights = intermediates_ref["attention_layers"][i]["attention_weights"][0]
        close(layers[i]["attention_weights"][0], ref_weights, atol=1e-6)

    _, intermediates = nnx.capture(module, nnx.Intermediate)(x)
    assert not intermediates  # empty


@pytest.mark.parametrize("variant", variants(pallas_decoding=True))
def test_autoregressive_decode_with_x64(variant):
    with enable_x64():
        x = jax.random.normal(jax.random.key(0), (1, 4, 4), jnp.float64)
        kw = {"in_features": 4, "num_heads": 2, "qkv_features": 4, "decode": True}
        module, ref = with_flax_weights(variant, **kw, seed=0)
        for m in (module, ref):
            m.init_cache(x.shape, dtype=x.dtype)
        assert module.cached_key.shape == (1, 4, 2, 2)
        assert module.cached_value.shape == (1, 4, 2, 2)
        for t in range(2):
            y = apply(module, x[:, t : t + 1, :])
            assert y.shape == (1, 1, 4)
            close(y, apply(ref, x[:, t : t + 1, :]))


@pytest.mark.parametrize("keep_rngs", [True, False])
def test_keep_rngs(keep_rngs):
    """Construction only: no implementation is involved."""
    kw = {"in_features": 4, "num_heads": 2, "qkv_features": 4, "decode": True,
          "dropout_rate": 0.5, "keep_rngs": keep_rngs}  # fmt: skip
    module = ann.MultiHeadAttention(**kw, rngs=nnx.Rngs(42))
    ref = nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(42))
    if keep_rngs:
        assert module.rngs is not None
        _, _, nondiff = nnx.split(module, nnx.Param, ...)
        assert isinstance(nondiff["rngs"]["count"], nnx.RngCount)
        assert isinstance(nondiff["rngs"]["key"], nnx.RngKey)
    else:
        assert module.rngs is None
        nnx.split(module, nnx.Param)
    paths = {p for p, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))}
    assert paths == {p for p, _ in nnx.to_flat_state(nnx.state(ref, nnx.Param))}


PALLAS_DENSE_MASK = pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="a dense boolean mask, which implementation='pallas' refuses (documented: use "
    "'chunked')",
)


class _Dummy(nnx.Module):
    pass


@pytest.mark.parametrize(
    "impl", [*IMPLS[:2], pytest.param("pallas", marks=PALLAS_DENSE_MASK), "dense via module"]
)
@pytest.mark.parametrize("is_cross_attention", [True, False])
@pytest.mark.parametrize("use_padding", [True, False])
def test_causal_mask_equivalence(use_padding, is_cross_attention, impl):
    """The adapter with a precombined mask equals the adapter with ``is_causal`` and the
    padding mask (two batch dims: ``[1, 1, T, N, H]``), and both equal Flax's
    ``nnx.dot_product_attention`` on rows with a visible key. ``impl`` runs the precombined
    call (``dense via module``: sowing, on the dense path); the ``is_causal`` call sows, so it
    is always dense."""
    batch_size, num_heads, q_len, head_dim = 1, 2, 2, 4
    kv_len = 4 if is_cross_attention else q_len
    q = jax.random.normal(jax.random.key(0), (batch_size, 1, q_len, num_heads, head_dim))
    k = jax.random.normal(jax.random.key(1), (batch_size, 1, kv_len, num_heads, head_dim))
    v = jax.random.normal(jax.random.key(2), (batch_size, 1, kv_len, num_heads, head_dim))
    causal_mask = jnp.broadcast_to(
        jnp.tril(jnp.ones((q_len, kv_len), jnp.bool_)), (batch_size, 1, num_heads, q_len, kv_len)
    )
    padding_mask = None
    if use_padding:
        padding_mask = jnp.ones((batch_size, 1, 1, q_len, kv_len), jnp.bool_)
        padding_mask = padding_mask.at[..., -2:].set(False)
    manual_mask = combine_masks(padding_mask, causal_mask, dtype=q.dtype)

    sows = impl == "dense via module"
    fast = ann.attention_fn(implementation="xla" if sows else impl)

    def run_fast(m):
        return fast(q, k, v, mask=manual_mask, is_causal=False, deterministic=True,
                    module=m if sows else None)  # fmt: skip

    def run(m):
        return ann.attention_fn()(q, k, v, mask=padding_mask, is_causal=True,
                                  deterministic=True, module=m)  # fmt: skip

    attn_fast, _ = nnx.capture(run_fast, nnx.Intermediate)(_Dummy())
    attn_manual, _ = nnx.capture(run, nnx.Intermediate)(_Dummy())
    np.testing.assert_allclose(attn_fast, attn_manual, atol=1e-6)

    expected = nnx.dot_product_attention(q, k, v, mask=manual_mask, deterministic=True)
    visible = jnp.any(manual_mask > 0, axis=-1)  # [B, 1, N, T]
    visible = jnp.swapaxes(visible, -1, -2)[..., None]  # [B, 1, T, N, 1], as the output
    visible = jnp.broadcast_to(visible, attn_fast.shape)
    np.testing.assert_allclose(
        jnp.where(visible, attn_fast, 0.0), jnp.where(visible, expected, 0.0), atol=1e-5
    )
    np.testing.assert_array_equal(jnp.where(visible, 0.0, attn_fast), 0.0)


# ---------------------------------------------------------------- TestLinenConsistency

LINEN_FULL = [
    pytest.param("ours", *case, id="ours-" + "-".join(map(str, case)))
    for case in [
        (b, dt, pdt, p, dec, nqk)
        for b in (True, False)
        for dt in ("float32", "float16")
        for pdt in ("float32", "float16")
        for p in ("DEFAULT", "HIGHEST")
        for dec in (True, False)
        for nqk in (True, False)
    ]
]
LINEN_REDUCED = [  # the implementations need not see every dtype and precision
    pytest.param(
        v,
        True,
        "float32",
        "float32",
        "DEFAULT",
        dec,
        nqk,
        id=f"{v}-{dec}-{nqk}",
        marks=PALLAS_MASK if (v == "flax-fn-pallas" and dec) else (),
    )
    for v in VARIANTS[1:]
    for dec in (True, False)
    for nqk in (True, False)
]


@pytest.mark.parametrize(
    ("variant", "use_bias", "dtype", "param_dtype", "precision", "decode", "normalize_qk"),
    LINEN_FULL + LINEN_REDUCED,
)
def test_nnx_attention_equivalence(
    variant, use_bias, dtype, param_dtype, precision, decode, normalize_qk
):
    """Upstream's product for ``ours``; one unbatched token ``[1, 3]`` against Linen's module
    with Linen's weights (upstream: exact equality; here within rounding of ``dtype``)."""
    dtype, param_dtype = jnp.dtype(dtype), jnp.dtype(param_dtype)
    kw = {"use_bias": use_bias, "dtype": dtype, "param_dtype": param_dtype,
          "precision": getattr(Precision, precision), "decode": decode,
          "normalize_qk": normalize_qk}  # fmt: skip
    x = jnp.ones((1, 3))
    module = build(variant, num_heads=2, in_features=3, qkv_features=6, out_features=6, **kw,
                   rngs=nnx.Rngs(42))  # fmt: skip
    model = linen.MultiHeadDotProductAttention(num_heads=2, qkv_features=6, out_features=6, **kw)
    variables = model.init(jax.random.key(42), x)
    for qkvo in ("query", "key", "value", "out"):
        getattr(module, qkvo).kernel[...] = variables["params"][qkvo]["kernel"]
        if use_bias:
            getattr(module, qkvo).bias[...] = variables["params"][qkvo]["bias"]
    if decode:
        module.init_cache(x.shape, dtype=dtype)
    out = module(x)
    expected, _ = model.apply(variables, x, mutable=["cache"])
    assert out.dtype == expected.dtype
    tol = 1e-6 if jnp.float16 not in (dtype, param_dtype) else 2e-3
    close(out, expected, atol=tol, rtol=tol)


# ---------------------------------------------------------------- TestKVFeatures


@pytest.mark.parametrize("variant", VARIANTS)
def test_varying_num_features(variant):
    kw = {"num_heads": 2, "in_features": 3, "qkv_features": 6, "out_features": 6,
          "in_kv_features": 4, "decode": False}  # fmt: skip
    module, ref = with_flax_weights(variant, **kw, seed=42)
    x = jnp.ones((1, 3))
    y = jax.random.normal(jax.random.key(42), (1, 4))
    out = apply(module, x, y)
    assert out is not None
    close(out, apply(ref, x, y))


# ---------------------------------------------------------------- TestGQADotProductAttention


@pytest.mark.parametrize("impl", IMPLS)
def test_gqa_shapes(impl):
    B, T, S, D = 2, 4, 5, 8
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    query = jax.random.normal(k1, (B, T, 6, D))
    key = jax.random.normal(k2, (B, S, 3, D))
    value = jax.random.normal(k3, (B, S, 3, D))
    output = jax.jit(ann.attention_fn(implementation=impl))(query, key, value)
    assert output.shape == (B, T, 6, D)
    close(output, nnx.dot_product_attention(query, key, value), atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_gqa_invalid_heads(impl):
    query = jnp.ones((1, 4, 5, 8))
    key = value = jnp.ones((1, 4, 2, 8))
    with pytest.raises(ValueError, match="must be a multiple"):
        ann.attention_fn(implementation=impl)(query, key, value)


@pytest.mark.parametrize("variant", variants(pallas_decoding=True))
def test_gqa_multihead_attention(variant):
    in_feat, n_heads, n_kv_heads, qkv_feat = 128, 32, 8, 2048
    head_dim = qkv_feat // n_heads
    kw = {"num_heads": n_heads, "in_features": in_feat, "qkv_features": qkv_feat,
          "num_kv_heads": n_kv_heads}  # fmt: skip
    model, ref = with_flax_weights(variant, **kw, seed=0)
    assert model.query.kernel.shape == (in_feat, n_heads, head_dim)
    assert model.key.kernel.shape == (in_feat, n_kv_heads, head_dim)
    assert model.value.kernel.shape == (in_feat, n_kv_heads, head_dim)

    x = jax.random.normal(jax.random.key(1), (1, 10, in_feat))
    y = apply(model, x, decode=False)
    assert y.shape == (1, 10, in_feat)
    close(y, apply(ref, x, decode=False), atol=1e-4)

    for m in (model, ref):
        m.init_cache((1, 10, in_feat))
    assert model.cached_key.shape == (1, 10, n_kv_heads, head_dim)
    y_token = apply(model, x[:, :1], decode=True)
    assert y_token.shape == (1, 1, in_feat)
    assert model.cache_index == 1
    close(y_token, apply(ref, x[:, :1], decode=True), atol=1e-4)


@pytest.mark.parametrize("impl", [*IMPLS, "dense via module"])
def test_gqa_parity_with_jax(impl):
    B, T, S, D = 2, 8, 8, 16
    k1, k2, k3 = jax.random.split(jax.random.key(42), 3)
    query = jax.random.normal(k1, (B, T, 4, D))
    key = jax.random.normal(k2, (B, S, 2, D))
    value = jax.random.normal(k3, (B, S, 2, D))
    jax_out = jax.nn.dot_product_attention(query, key, value)

    fn = ann.attention_fn(implementation="xla" if impl == "dense via module" else impl)

    def run(m):
        return fn(query, key, value, module=m if impl == "dense via module" else None)

    out, _ = nnx.capture(run, nnx.Intermediate)(_Dummy())
    np.testing.assert_allclose(out, jax_out, atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------- TestDotProductAttentionValidation


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "v_shape", "match"),
    [
        ((2, 16, 4, 8), (16, 4, 8), (16, 4, 8), "rank"),
        ((2, 16, 4, 8), (3, 16, 4, 8), (3, 16, 4, 8), "batch dims"),
        ((2, 16, 4, 8), (2, 16, 4, 8), (2, 15, 4, 8), "length"),
        ((2, 16, 4, 8), (2, 16, 4, 7), (2, 16, 4, 8), "head size"),
    ],
    ids=["rank", "batch", "kv length", "depth"],
)
def test_invalid_shapes(q_shape, k_shape, v_shape, match):
    """Upstream's messages are Flax's; attnjax names the same faults in its own words, or,
    under the suite's jaxtyping runtime checks, the annotation check fires first with a
    ``TypeCheckError`` naming the argument (the project's convention, as in
    ``tests/test_attention.py``)."""
    q, k, v = jnp.ones(q_shape), jnp.ones(k_shape), jnp.ones(v_shape)
    errors = (ValueError, jaxtyping.TypeCheckError)
    with pytest.raises(errors, match=rf"{match}|parameter '(query|key|value)'"):
        ann.attention_fn()(q, k, v, dropout_rate=0.1, dropout_rng=jax.random.key(0))


# ---------------------------------------------------------------- beyond upstream: Flax's contract

BATCH_SHAPES = [(), (2, 3)]  # one batch dim: every case above


@pytest.mark.parametrize("batch", BATCH_SHAPES, ids=["unbatched", "2 batch dims"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_leading_batch_dims_match_flax(variant, batch):
    """Flax's module takes ``[batch..., length, features]`` with any number of batch dims
    (cross-attention to other lengths, causal: jax.nn's top-left alignment)."""
    kw = {"num_heads": 2, "in_features": 4, "qkv_features": 8, "num_kv_heads": 1,
          "normalize_qk": True, "decode": False}  # fmt: skip
    module, ref = with_flax_weights(variant, **kw, seed=3)
    x = jax.random.normal(jax.random.key(0), (*batch, 5, 4))
    y = jax.random.normal(jax.random.key(1), (*batch, 3, 4))
    close(apply(module, x, y, is_causal=True), apply(ref, x, y, is_causal=True))


@pytest.mark.parametrize("batch", BATCH_SHAPES, ids=["unbatched", "2 batch dims"])
@pytest.mark.parametrize("variant", variants(pallas_decoding=True))
def test_decoding_with_leading_batch_dims_matches_flax(variant, batch):
    """``init_cache((*batch, max_length, features))`` then one token at a time."""
    kw = {"num_heads": 2, "in_features": 4, "qkv_features": 8, "num_kv_heads": 1,
          "decode": True}  # fmt: skip
    module, ref = with_flax_weights(variant, **kw, seed=3)
    x = jax.random.normal(jax.random.key(0), (*batch, 3, 4))
    for m in (module, ref):
        m.init_cache(x.shape)
    assert module.cached_key.shape == ref.cached_key.shape
    for t in range(3):
        close(apply(module, x[..., t : t + 1, :]), apply(ref, x[..., t : t + 1, :]))


def test_every_flax_argument_is_taken_and_flax_defaults_give_flax_outputs():
    """Every constructor and call parameter of Flax's signature exists on ours; passing Flax's
    defaults for the ones beyond the shared core changes nothing."""
    ctor = inspect.signature(nnx.MultiHeadAttention.__init__).parameters
    call = inspect.signature(nnx.MultiHeadAttention.__call__).parameters
    assert set(ctor) <= set(inspect.signature(ann.MultiHeadAttention.__init__).parameters)
    assert set(call) <= set(inspect.signature(ann.MultiHeadAttention.__call__).parameters)
    extra = ("qkv_promote_dtype", "out_promote_dtype", "ln_promote_dtype", "qkv_dot_general",
             "out_dot_general", "qkv_dot_general_cls", "out_dot_general_cls", "kernel_metadata",
             "out_kernel_metadata", "bias_metadata", "out_bias_metadata",
             "query_ln_scale_metadata", "key_ln_scale_metadata")  # fmt: skip
    defaults = {name: ctor[name].default for name in extra}
    kw = {"num_heads": 2, "in_features": 4, "qkv_features": 8, "normalize_qk": True,
          "decode": False}  # fmt: skip
    ref = nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(0))
    ours = ann.MultiHeadAttention(**kw, **defaults, rngs=nnx.Rngs(0))
    nnx.update(ours, nnx.state(ref, nnx.Param))
    x = jax.random.normal(jax.random.key(0), (2, 5, 4))
    close(ours(x, out_sharding=None, qkv_sharding=None), ref(x))


def test_flax_default_initialization():
    """Flax's default kernel initializer (LeCun normal), drawn in Flax's order: the same seed
    gives Flax's parameters."""
    kw = {"num_heads": 4, "in_features": 16, "qkv_features": 32, "out_features": 8,
          "num_kv_heads": 2, "normalize_qk": True}  # fmt: skip
    ref = dict(nnx.to_flat_state(nnx.state(nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(7)),
                                           nnx.Param)))  # fmt: skip
    ours = dict(nnx.to_flat_state(nnx.state(ann.MultiHeadAttention(**kw, rngs=nnx.Rngs(7)),
                                            nnx.Param)))  # fmt: skip
    assert set(ours) == set(ref)
    for path, value in ours.items():
        np.testing.assert_array_equal(value[...], ref[path][...], err_msg=str(path))


DENSE_DROPOUT = pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="active dropout drops attention weights, which only the dense path forms: "
    "MultiHeadAttention(implementation=<tiled>) raises (documented)",
)


@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=DENSE_DROPOUT if v in ("ours-chunked", "ours-pallas") else ())
     for v in VARIANTS],
)  # fmt: skip
def test_dropout_matches_flax(variant):
    """Upstream builds modules with dropout (``test_keep_rngs``) but never calls them: with
    the same seeds, ours and the adapter draw Flax's broadcast dropout mask."""
    kw = {"in_features": 4, "num_heads": 2, "qkv_features": 4, "dropout_rate": 0.5}
    module, ref = with_flax_weights(variant, **kw, decode=False, seed=42)
    x = jax.random.normal(jax.random.key(0), (2, 5, 4))
    for _ in range(2):  # the second call draws the next mask
        close(apply(module, x, deterministic=False), apply(ref, x, deterministic=False))


def test_view_sets_deterministic_and_decode_as_flax_does():
    kw = {"num_heads": 2, "in_features": 4, "dropout_rate": 0.5, "deterministic": False}
    ours, ref = with_flax_weights("ours", **kw, decode=False, seed=0)
    x = jax.random.normal(jax.random.key(0), (2, 5, 4))
    assert not np.allclose(ours(x), ours(x, deterministic=True))  # dropout is on
    evaluated = nnx.view(ours, deterministic=True)
    assert evaluated.deterministic is True and ours.deterministic is False
    close(evaluated(x), ref(x, deterministic=True))
    # Flax's set_view means to build the cache [*batch_size, max_length, K, H] when there is
    # none, but its __init__ sets cached_key = None, so its hasattr test never fires and
    # Flax's view keeps no cache: ours may build it; if it does, with that shape.
    for batch_size in (2, (2, 3)):
        view = nnx.view(ours, decode=True, batch_size=batch_size, max_length=5)
        assert view.decode is True and not ours.decode
        if view.cached_key is not None:
            shape = (*np.atleast_1d(batch_size), 5, 2, 2)
            assert view.cached_key.shape == view.cached_value.shape == shape
            assert view.cache_index[...] == 0
    assert nnx.view(ref, decode=True, batch_size=2, max_length=5).cached_key is None
