"""``attnjax.nn.hooks``: hook points named after the parameter paths; cached values against
values recomputed by hand and against ``capture_attention``; interventions (zero ablation
against a zeroed output projection, patching from a second batch, identity) under ``jit``,
``grad`` and ``vmap``; the tiled paths (chunked, Pallas in interpret mode)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann
from attnjax import mods
from attnjax.masks import block_mask
from attnjax.nn.hooks import AXES, _context
from attnjax.patterns import FULL_PATTERN_MAX_LOGITS

B, T, V, C = 4, 6, 5, 3  # tests/nn/test_models.py's shapes
CONFIG = ann.ModelConfig(
    width=16, layers=2, heads=4, kv_heads=2, vocab_size=V, num_classes=C, causal=True,
    positional="rope",
)  # fmt: skip
CLEAN = {"inputs": jax.random.randint(jax.random.key(0), (B, T), 0, V)}
CORRUPT = {"inputs": jax.random.randint(jax.random.key(1), (B, T), 0, V)}
Z1 = "encoder.blocks.1.attention.z"


@functools.cache
def _model(implementation=None, **overrides):
    config = dataclasses.replace(CONFIG, implementation=implementation, **overrides)
    return ann.build(config, nnx.Rngs(0))


@pytest.fixture(scope="module")
def dense():
    model = _model()
    return model, *ann.run_with_cache(model, CLEAN)


def test_names_follow_the_parameter_paths(dense):
    model, out, cache = dense
    np.testing.assert_array_equal(out, model(CLEAN))  # reading changes nothing
    blocks = [f"encoder.blocks.{i}" for i in range(2)]
    expected = {f"{b}.{p}" for b in blocks for p in ("resid_pre", "mlp_out", "resid_post")}
    points = ("q", "k", "v", "logits", "pattern", "z", "result")
    expected |= {f"{b}.attention.{p}" for b in blocks for p in points}
    assert set(cache) == expected
    paths = {".".join(map(str, p)) for p, _ in nnx.iter_modules(model)}
    assert all(name.rpartition(".")[0] in paths for name in cache)
    context = cache.context("encoder.blocks.1.attention.pattern")
    assert (context.layer, context.point, context.head_axis) == (1, "attention.pattern", -3)
    assert cache.stack("attention.z").shape == (2, B, T, 4, 4)
    np.testing.assert_array_equal(cache["attention.z", 1, 3], cache[Z1][:, :, 3])
    _, chosen = ann.run_with_cache(model, CLEAN, names=lambda name: name.endswith("1.resid_pre"))
    assert list(chosen) == ["encoder.blocks.1.resid_pre"]


def test_cached_values_equal_the_values_recomputed_by_hand(dense):
    """q, k, v from the block's own norm, projections and RoPE; logits and pattern of the
    grouped heads by hand; the pattern as capture_attention's weights; result = z W_O per
    head, summing with the bias to the attention output."""
    model, _, cache = dense
    _, weights, _ = ann.capture_attention(model, CLEAN)
    for i, block in enumerate(model.encoder.blocks):
        name = f"encoder.blocks.{i}"
        attention, x = block.attention, cache[f"{name}.resid_pre"]
        h = block.attention_norm(x)
        positions = jnp.arange(T)
        q = ann.rope(attention.query(h), positions)
        k = ann.rope(attention.key(h), positions)
        np.testing.assert_allclose(cache[f"{name}.attention.q"], q, atol=1e-6)
        np.testing.assert_allclose(cache[f"{name}.attention.k"], k, atol=1e-6)
        np.testing.assert_allclose(cache[f"{name}.attention.v"], attention.value(h), atol=1e-6)
        logits = jnp.einsum("btnh,bsnh->bnts", q, jnp.repeat(k, 2, axis=2)) / 2.0  # √H = 2
        logits = jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -jnp.inf)
        np.testing.assert_allclose(cache[f"{name}.attention.logits"], logits, atol=1e-5)
        np.testing.assert_allclose(
            cache[f"{name}.attention.pattern"], jax.nn.softmax(logits), atol=1e-6
        )
        np.testing.assert_allclose(cache[f"{name}.attention.pattern"], weights[i], atol=1e-6)
        z, result = cache[f"{name}.attention.z"], cache[f"{name}.attention.result"]
        kernel, bias = attention.out.kernel[...], attention.out.bias[...]
        np.testing.assert_allclose(result, jnp.einsum("btnh,nhd->btnd", z, kernel), atol=1e-6)
        mid = cache[f"{name}.resid_post"] - cache[f"{name}.mlp_out"]
        np.testing.assert_allclose(result.sum(-2) + bias[None, None], mid - x, atol=1e-5)


def test_attention_module_alone_z_and_result_sum_to_its_output(dense):
    model, _, reference = dense
    layer = model.encoder.blocks[0].attention
    x = reference["encoder.blocks.0.resid_pre"].reshape(2, 2, T, 16)  # two batch dimensions
    out, cache = ann.run_with_cache(layer, x, names=["q", "z", "res*"])
    assert set(cache) == {"q", "z", "result"}
    assert cache["q"].shape == (2, 2, T, 4, 4)
    np.testing.assert_array_equal(out, layer(x))
    bias = layer.out.bias[...][None, None, None]
    np.testing.assert_allclose(cache["result"].sum(-2) + bias, out, atol=1e-6)
    zeroed = ann.run_with_hooks(layer, x, {"z": lambda z, c: jnp.zeros_like(z)})
    np.testing.assert_allclose(zeroed, jnp.broadcast_to(bias, out.shape))


def test_a_flax_attention_fn_layer_has_every_point_but_logits_and_pattern(dense):
    x = dense[2]["encoder.blocks.0.resid_pre"]
    layer = ann.MultiHeadAttention(
        4, 16, num_kv_heads=2, attention_fn=nnx.dot_product_attention, rngs=nnx.Rngs(0)
    )
    out, cache = ann.run_with_cache(layer, x)
    assert set(cache) == {"q", "k", "v", "z", "result"}
    np.testing.assert_array_equal(out, layer(x))
    with pytest.raises(ValueError, match="'pattern': matches no hook point"):
        ann.run_with_hooks(layer, x, {"pattern": lambda w, c: w})


def test_ablated_head_equals_its_output_projection_rows_zeroed(dense):
    """Zero ablation of a head's z equals its rows of W_O zeroed; mean ablation (its mean
    over the clean batch and positions) equals them zeroed and their mean term in the bias."""
    model, _, cache = dense
    head, mean = 2, cache[Z1][..., 2, :].mean((0, 1))
    zeroed = ann.run_with_hooks(model, CORRUPT, {Z1: lambda z, c: z.at[..., head, :].set(0.0)})
    averaged = ann.run_with_hooks(model, CORRUPT, {Z1: lambda z, c: z.at[..., head, :].set(mean)})
    reference = nnx.clone(model)
    out = reference.encoder.blocks[1].attention.out
    kernel = out.kernel[...]
    out.kernel[...] = kernel.at[head].set(0.0)
    np.testing.assert_allclose(zeroed, reference(CORRUPT), atol=1e-6)
    out.bias[...] = out.bias[...] + mean @ kernel[head]
    np.testing.assert_allclose(averaged, reference(CORRUPT), atol=1e-5)
    assert not np.allclose(zeroed, model(CORRUPT), atol=1e-3)
    assert not np.allclose(averaged, zeroed, atol=1e-3)


def test_patching_from_a_second_batch(dense):
    """Patching the first block's input at positions 0..p from the clean run gives the
    clean output at those positions (a causal model), and patching every block's input
    restores the clean output exactly."""
    model, clean_out, cache = dense
    p = 2

    def patch(value, context):
        clean = cache[context.name]
        return value.at[:, : p + 1].set(clean[:, : p + 1])

    patched = ann.run_with_hooks(model, CORRUPT, {"encoder.blocks.0.resid_pre": patch})
    np.testing.assert_allclose(patched[:, : p + 1], clean_out[:, : p + 1], atol=1e-6)
    assert not np.allclose(patched[:, p + 1 :], clean_out[:, p + 1 :], atol=1e-3)
    restored = ann.run_with_hooks(model, CORRUPT, {"*.resid_pre": lambda v, c: cache[c.name]})
    np.testing.assert_array_equal(restored, clean_out)


def test_identity_hooks_leave_the_output_unchanged(dense):
    model, clean_out, _ = dense
    points = [f"*.{p}" for p in AXES if p != "result"]
    out = ann.run_with_hooks(model, CLEAN, dict.fromkeys(points, lambda v, c: v))
    np.testing.assert_array_equal(out, clean_out)
    summed = ann.run_with_hooks(model, CLEAN, {"*.result": lambda v, c: v})
    np.testing.assert_allclose(summed, clean_out, atol=1e-5)  # the heads summed, then the bias


def _program(model, call) -> str:
    """The jaxpr of the loss ``call(model).sum()`` and its gradient in the parameters."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
        return call(nnx.merge(graphdef, params, rest)).sum()

    return str(jax.make_jaxpr(jax.value_and_grad(loss))(params))


@pytest.mark.parametrize("implementation", [None, "chunked"])
def test_points_nothing_selects_add_no_operation(implementation):
    """The cost of hooks is only what is selected: a session that selects nothing, or caches
    a value the forward computes anyway, traces the plain forward's program, forward and
    backward (benchmarks/hooks.py times the rest)."""
    model = _model(implementation)
    plain = _program(model, lambda m: m(CLEAN))
    assert _program(model, lambda m: ann.run_with_hooks(m, CLEAN, {})) == plain
    cached = _program(model, lambda m: ann.run_with_cache(m, CLEAN, "*.1.resid_post")[0])
    assert cached == plain
    ablated = _program(model, lambda m: ann.run_with_hooks(m, CLEAN, {Z1: lambda z, c: 0 * z}))
    assert ablated != plain  # the comparison sees a hook


def test_interventions_under_jit_vmap_and_grad(dense):
    """A batch of head masks under vmap equals each mask alone; the gradient of a logit with
    respect to a hook point's value (attribution) is causal and matches central differences.
    (run_with_cache under jit: the tiled-path tests.)"""
    model, _, cache = dense

    def masked(keep):  # a batch of head masks: one intervention each
        return ann.run_with_hooks(model, CLEAN, {Z1: lambda z, c: z * keep[None, None, :, None]})

    masks = jnp.array([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    outs = jax.jit(jax.vmap(masked))(masks)
    for keep, out in zip(masks, outs, strict=True):
        np.testing.assert_allclose(out, masked(keep), atol=1e-6)

    name = "encoder.blocks.1.resid_pre"

    def metric(delta):  # attribution: the gradient of a logit w.r.t. the residual stream
        out = ann.run_with_hooks(model, CLEAN, {name: lambda v, c: v + delta})
        return out[0, 2, 1]

    grad = jax.jit(jax.grad(metric))(jnp.zeros_like(cache[name]))
    assert grad.shape == cache[name].shape
    assert jnp.all(jnp.any(grad[0, :3] != 0, -1))
    assert not jnp.any(grad[:, 3:]) and not jnp.any(grad[1:])  # causal, one batch row
    direction = jax.random.normal(jax.random.key(3), grad.shape)
    eps = 1e-2
    numeric = (metric(eps * direction) - metric(-eps * direction)) / (2 * eps)
    np.testing.assert_allclose(jnp.vdot(grad, direction), numeric, rtol=2e-2)


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_tiled_paths_cache_like_the_dense_path(dense, implementation):
    """Every point of a model on a tiled path equals the dense model's; patterns come from
    the saved log-sum-exp for the chosen rows and heads."""
    _, reference_out, reference = dense
    graphdef, state = nnx.split(_model(implementation))
    rows, heads = [1, 5], [3, 0]

    @jax.jit
    def cached(state):
        return ann.run_with_cache(nnx.merge(graphdef, state), CLEAN, rows=rows, heads=heads)

    out, cache = cached(state)
    np.testing.assert_allclose(out, reference_out, atol=1e-5)
    for name, value in cache.items():
        expected = reference[name]
        if name.endswith(("pattern", "logits")):
            expected = expected[:, heads][:, :, rows]
            assert value.shape == (B, 2, 2, T)
        np.testing.assert_allclose(value, expected, atol=1e-5, err_msg=name)


def test_chunked_rows_of_an_additive_score_with_a_score_mod(dense):
    """Per-head score parameters and a score mod reach the recomputed rows."""
    x = dense[2]["encoder.blocks.0.resid_pre"]
    rows, heads = [1, 5], [3, 0]

    def cached(implementation, **selection):
        layer = ann.MultiHeadAttention(
            4, 16, num_kv_heads=2, score="additive", score_mod=mods.alibi(4),
            implementation=implementation, rngs=nnx.Rngs(0),
        )  # fmt: skip
        graphdef, state = nnx.split(layer)
        run = jax.jit(lambda s: ann.run_with_cache(nnx.merge(graphdef, s), x, **selection))
        return run(state)[1]

    reference, cache = cached("xla"), cached("chunked", rows=rows, heads=heads)
    for name in ("logits", "pattern"):
        expected = reference[name][:, heads][:, :, rows]
        np.testing.assert_allclose(cache[name], expected, atol=1e-5, err_msg=name)


def _logits_by_hand(score, params, q, k):
    """``[B, N, T, S]`` logits of ``score`` from per-head ``q [B, T, N, H]`` and ``k [B, S,
    N, H]``, written out with einsum (not attnjax.scores)."""
    if score == "dot":
        return jnp.einsum("btnh,bsnh->bnts", q, k)
    if score == "bilinear":
        return jnp.einsum("btnh,nhg,bsng->bnts", q, params["w"], k)
    if score == "cosine":
        unit = lambda x: x / jnp.sqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-12)  # noqa: E731
        return params["scale"][None, :, None, None] * jnp.einsum(
            "btnh,bsnh->bnts", unit(q), unit(k)
        )
    hidden = jnp.einsum("btnh,nha->bnta", q, params["w_q"])[:, :, :, None]
    hidden = hidden + jnp.einsum("bsnh,nha->bnsa", k, params["w_k"])[:, :, None]
    return jnp.einsum(
        "bntsa,na->bnts", jnp.tanh(hidden + params["b"][None, :, None, None]), params["v"]
    )


@pytest.mark.parametrize("score", ["dot", "bilinear", "additive", "cosine"])
def test_every_score_caches_its_logits_of_the_cached_queries_and_keys(dense, score):
    """With GQA (4 heads, 2 key groups): the cached logits are the score of the cached q and
    k written out by hand, the pattern their softmax, z the pattern times v; the chunked
    path's cache equals the dense path's."""
    x = dense[2]["encoder.blocks.0.resid_pre"]

    def cached(implementation):
        layer = ann.MultiHeadAttention(
            4, 16, num_kv_heads=2, score=score, implementation=implementation, rngs=nnx.Rngs(0)
        )
        graphdef, state = nnx.split(layer)
        return layer, jax.jit(lambda s: ann.run_with_cache(nnx.merge(graphdef, s), x))(state)[1]

    layer, cache = cached("xla")
    q, k, v = (cache[n] for n in "qkv")
    k, v = (jnp.repeat(a, 2, axis=2) for a in (k, v))  # each key group serves two heads
    logits = _logits_by_hand(score, layer.score(), q, k)
    np.testing.assert_allclose(cache["logits"], logits, atol=1e-5)
    np.testing.assert_allclose(cache["pattern"], jax.nn.softmax(logits), atol=1e-6)
    z = jnp.einsum("bnts,bsnh->btnh", cache["pattern"], v)
    np.testing.assert_allclose(cache["z"], z, atol=1e-5)
    chunked = cached("chunked")[1]
    for name, value in chunked.items():
        np.testing.assert_allclose(value, cache[name], atol=1e-5, err_msg=name)


def test_a_block_mask_reaches_the_recomputed_logits_and_pattern(dense):
    """A call's block mask (its mask_mod: a window of 2 keys back) masks the cached logits
    and pattern of its fast path as it masks the dense weights."""
    x = dense[2]["encoder.blocks.0.resid_pre"]
    layer = dense[0].encoder.blocks[0].attention
    window = block_mask(mods.sliding_window(2), num_queries=T, num_keys=T)
    _, weights = layer(x, block_mask=window, return_weights=True)
    _, cache = ann.run_with_cache(layer, x, names=["logits", "pattern"], block_mask=window)
    np.testing.assert_allclose(cache["pattern"], weights, atol=1e-6)
    t, s = np.arange(T)[:, None], np.arange(T)[None]
    visible = np.broadcast_to((s <= t) & (s >= t - 2), cache["logits"].shape)
    np.testing.assert_array_equal(np.isneginf(cache["logits"]), ~visible)


def test_replacing_the_pattern_on_a_tiled_path_needs_the_dense_switch():
    def uniform_weights(weights, context):
        visible = (weights > 0).astype(weights.dtype)
        return visible / visible.sum(-1, keepdims=True)

    uniform = {"*.pattern": uniform_weights}
    with pytest.raises(ValueError, match="dense=True"):
        ann.run_with_hooks(_model("chunked"), CLEAN, uniform)
    on_dense = ann.run_with_hooks(_model("chunked"), CLEAN, uniform, dense=True)
    np.testing.assert_allclose(on_dense, ann.run_with_hooks(_model(), CLEAN, uniform), atol=1e-6)
    assert not np.allclose(on_dense, _model()(CLEAN), atol=1e-3)


def test_errors():
    model = _model("chunked", causal=False, positional="none", layers=1, mlp=False)
    long = {"inputs": jnp.zeros((1, 4097), jnp.int32)}  # 4097² > FULL_PATTERN_MAX_LOGITS
    assert 4097**2 > FULL_PATTERN_MAX_LOGITS
    with pytest.raises(ValueError, match="rows="):
        jax.eval_shape(lambda: ann.run_with_cache(model, long, names="*.pattern"))
    rows = jax.eval_shape(lambda: ann.run_with_cache(model, long, "*.pattern", rows=[0, 9]))[1]
    assert rows["encoder.blocks.0.attention.pattern"].shape == (1, 4, 2, 4097)
    with pytest.raises(ValueError, match=r"matches no hook point.*resid_pre"):
        ann.run_with_cache(model, CLEAN, names="encoder.blocks.0.attn.z")
    with pytest.raises(ValueError, match="matches no hook point"):
        ann.run_with_hooks(model, CLEAN, {"*.hook_z": lambda v, c: v})
    with pytest.raises(ValueError, match="returned shape"):
        ann.run_with_hooks(model, CLEAN, {"*.z": lambda v, c: v[..., 0]})


def test_two_stacks_sharing_a_layer_index_are_indexed_by_name():
    names = ["encoder.blocks.0.attention.z", "decoder.blocks.0.attention.z"]
    cache = ann.ActivationCache(
        {n: jnp.full((1, 2, 3, 4), i) for i, n in enumerate(names)},
        {n: _context(n, "z") for n in names},
    )
    assert int(cache[names[1]][0, 0, 0, 0]) == 1
    with pytest.raises(KeyError, match=r"several.*index by name"):
        cache["attention.z", 0]
    with pytest.raises(KeyError, match="several stacks of layers"):
        cache.stack("attention.z")
    with pytest.raises(KeyError, match=r"no cached .attention\.z. at layer 1"):
        cache["attention.z", 1]
