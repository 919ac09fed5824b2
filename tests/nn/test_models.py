import dataclasses
import inspect

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import optax
import pytest
from flax import nnx

import attnjax.nn as ann

B, T, V, C = 4, 6, 5, 3
TOKENS = jax.random.randint(jax.random.key(0), (B, T), 0, V)
FEATURES = jax.random.normal(jax.random.key(1), (B, T, 2))
TARGETS = jax.random.randint(jax.random.key(2), (B, T), 0, C)
BASE = ann.ModelConfig(width=16, layers=1, heads=2, vocab_size=V, in_features=2, num_classes=C)


def _train(model, batch, steps=8):
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        def loss_fn(model):
            logits = model(batch)
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return [float(step(model, optimizer, batch)) for _ in range(steps)]


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "kind": "transformer",
            "layers": 2,
            "positional": "sinusoidal",
            "causal": True,
            "dropout": 0.1,
        },
        {"kind": "transformer", "positional": "rope", "embedding": "linear", "score": "additive"},
        {"kind": "rnn", "cell": "gru"},
        {"kind": "rnn", "cell": "lstm", "embedding": "linear"},
        {"kind": "cnn"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_each_model_trains_with_decreasing_loss(overrides):
    config = dataclasses.replace(BASE, **overrides)
    inputs = TOKENS if config.embedding == "tokens" else FEATURES
    model = ann.add_head_gates(ann.build(config, nnx.Rngs(0)))
    losses = _train(model, {"inputs": inputs, "targets": TARGETS})
    assert losses[-1] < 0.7 * losses[0], losses
    for gate in jax.tree.leaves(nnx.state(model, ann.HeadGate)):
        np.testing.assert_array_equal(gate, 1.0)


def test_one_layer_without_mlp_or_norms_is_a_skip_connection_and_a_readout():
    config = dataclasses.replace(BASE, layers=1, mlp=False, norms=False, embedding="linear")
    model = ann.build(config, nnx.Rngs(0))
    kinds = {type(m).__name__ for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module)}
    assert not kinds & {"LayerNorm", "Mlp"}
    x = model.embed(FEATURES)
    expected = model.readout(x + model.encoder.blocks[0].attention(x))
    np.testing.assert_allclose(model({"inputs": FEATURES}), expected, atol=1e-6)


def test_decoder_is_causal_and_attends_to_memory_of_another_length():
    decoder = ann.Decoder(2, 16, 4, num_kv_heads=2, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(3), (B, T, 16))
    memory = jax.random.normal(jax.random.key(4), (B, 3, 16))
    call = nnx.jit(lambda decoder, x, memory: decoder(x, memory))
    out = call(decoder, x, memory)
    assert out.shape == (B, T, 16)
    changed = call(decoder, x.at[:, 3:].set(5.0), memory)
    np.testing.assert_allclose(changed[:, :3], out[:, :3], atol=1e-5)
    assert not np.allclose(call(decoder, x, memory + 1.0), out)


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_bfloat16_model_gives_finite_float32_logits(kind):
    config = dataclasses.replace(
        BASE, kind=kind, cell="lstm", dtype="bfloat16", param_dtype="bfloat16", qk_norm=True
    )
    logits = nnx.jit(lambda model, batch: model(batch))(
        ann.build(config, nnx.Rngs(0)), {"inputs": TOKENS}
    )
    assert logits.dtype == jnp.float32 and logits.shape == (B, T, C)
    assert jnp.all(jnp.isfinite(logits))


def test_config_score_fields_reach_the_score_modules():
    config = dataclasses.replace(BASE, score="additive_relu", score_hidden=3, score_bias=False)
    score = ann.build(config, nnx.Rngs(0)).encoder.blocks[0].attention.score
    assert score.name == "additive_relu" and score().keys() == {"w_q", "w_k", "v"}
    assert score.v.shape == (2, 3)
    config = dataclasses.replace(BASE, score="additive", score_bias_init=0.5)
    score = ann.build(config, nnx.Rngs(0)).encoder.blocks[0].attention.score
    np.testing.assert_array_equal(score()["b"], np.full((2, 8), 0.5))
    config = dataclasses.replace(BASE, learnable_scale=True)
    assert ann.build(config, nnx.Rngs(0)).encoder.blocks[0].attention.score().keys() == {"scale"}


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"kind": "mamba"}, ValueError, "kind: expected one of"),
        ({"widht": 8}, ValueError, r"unknown keys \['widht'\]"),
        ({"width": 10, "heads": 4}, ValueError, "heads: expected a divisor of width=10"),
        ({"heads": 4, "kv_heads": 3}, ValueError, "kv_heads"),
        ({"width": "64"}, TypeError, "width: expected int"),
        ({"mlp": 1}, TypeError, "mlp: expected bool"),
        ({"embedding": "linear", "in_features": None}, ValueError, "in_features: required"),
        ({"score": "cosine", "score_hidden": 4}, ValueError, "score_hidden"),
        (
            {"score": "additive", "score_bias": False, "score_bias_init": 1.0},
            ValueError,
            "score_bias_init",
        ),
        ({"positional": "alibi"}, ValueError, "positional"),
        ({"dtype": "float64"}, ValueError, "dtype"),
        ({"kind": "rnn", "dropout": 0.1}, ValueError, "dropout: only the transformer"),
    ],
)
def test_config_rejects_bad_values_by_name(values, error, match):
    """Our own error, or under jaxtyping's runtime checks a ``TypeCheckError`` naming the
    field of a value of the wrong type."""
    field = next(iter(values))
    with pytest.raises((error, jaxtyping.TypeCheckError), match=rf"{match}|parameter '{field}'"):
        ann.ModelConfig.from_dict({"vocab_size": V, **values})


def test_cnn_receptive_field_is_where_the_input_gradient_ends():
    config = dataclasses.replace(BASE, kind="cnn", layers=2, embedding="linear")  # 1 + 2 * 3
    model = ann.build(config, nnx.Rngs(0))
    length = 12
    x = jax.random.normal(jax.random.key(3), (1, length, 2))
    grad = jax.grad(lambda x: model({"inputs": x})[0, -1].sum())(x)
    reached = np.flatnonzero(np.abs(np.asarray(grad[0])).sum(-1) > 0)
    assert length - reached.min() == config.receptive_field == 7
    assert BASE.receptive_field is None


def test_dropout_keys_differ_per_layer_and_follow_the_call():
    key = jax.random.key(0)
    first, second = (jax.random.key_data(ann.transformer.layer_rngs(key, i)) for i in (0, 1))
    assert not np.array_equal(first, second)
    rngs = nnx.Rngs(0)
    assert (
        ann.transformer.layer_rngs(rngs, 1) is rngs and ann.transformer.layer_rngs(None, 1) is None
    )
    config = dataclasses.replace(BASE, layers=2, dropout=0.5)
    model = ann.build(config, nnx.Rngs(0))
    out = {
        k: model({"inputs": TOKENS}, deterministic=False, rngs=jax.random.key(k)) for k in (1, 2)
    }
    again = model({"inputs": TOKENS}, deterministic=False, rngs=jax.random.key(1))
    np.testing.assert_array_equal(out[1], again)  # a key fixes every layer's mask
    assert not np.allclose(out[1], out[2])
    model.eval()
    np.testing.assert_array_equal(model({"inputs": TOKENS}), model({"inputs": TOKENS}))


def test_inputs_must_match_the_embedding():
    model = ann.build(BASE, nnx.Rngs(0))
    with pytest.raises(ValueError, match="inputs: embedding='tokens' expects int"):
        model({"inputs": FEATURES})


def _call_as_a_user(model, batch):
    """``model(batch)`` past the suite's jaxtyping hook, which refuses a batch that is not a
    mapping before the model sees it: what a user without the hook gets."""
    return inspect.unwrap(type(model).__call__)(model, batch)


@pytest.mark.parametrize("kind", ["transformer", "rnn", "cnn"])
def test_a_batch_is_a_dict_with_inputs(kind):
    model = ann.build(dataclasses.replace(BASE, kind=kind), nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"batch: \w+ expects a dict \{'inputs'.* shape \(4, 6\)"):
        _call_as_a_user(model, TOKENS)
    with pytest.raises(ValueError, match=r"batch: \w+ needs the key 'inputs'; got keys \['targ"):
        model({"targets": TARGETS})


def test_unknown_batch_keys_are_errors_naming_them_and_the_accepted_keys():
    model = ann.build(BASE, nnx.Rngs(0))
    segments = jnp.zeros((B, T), jnp.int32).at[:, 3:].set(1)
    accepted = r"\['inputs', 'segment_ids', 'positions', 'lengths', 'targets', 'loss_mask'\]"
    with pytest.raises(
        ValueError,
        match=rf"Transformer takes no key 'segment_id' \(did you mean 'segment_ids'\?\); "
        rf"accepted keys: {accepted}",
    ):
        model({"inputs": TOKENS, "segment_id": segments})
    with pytest.raises(ValueError, match=r"Rnn takes no key 'segment_ids'; accepted keys: \['inp"):
        ann.build(dataclasses.replace(BASE, kind="rnn"), nnx.Rngs(0))(
            {"inputs": TOKENS, "segment_ids": segments}
        )
    packed = {"inputs": TOKENS, "segment_ids": segments}
    task_batch = packed | {"targets": TARGETS, "loss_mask": jnp.ones((B, T), bool)}
    np.testing.assert_array_equal(model(task_batch), model(packed))  # the loss keys are ignored


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_token_ids_outside_the_vocabulary_are_an_error_or_nan_under_jit(kind):
    model = ann.build(dataclasses.replace(BASE, kind=kind), nnx.Rngs(0))
    jitted = nnx.jit(lambda model, batch: model(batch))
    for bad in (V, -1):
        tokens = TOKENS.at[1, 2].set(bad)
        low, high = min(bad, int(TOKENS.min())), max(bad, int(TOKENS.max()))
        with pytest.raises(
            ValueError,
            match=rf"inputs: token ids must be in \[0, vocab_size=5\), got ids from "
            rf"{low} to {high}",
        ):
            model({"inputs": tokens})
        logits = jitted(model, {"inputs": tokens})  # traced ids: the bad row is NaN, not clamped
        assert np.isnan(logits[1, 2:]).all(), logits[1]
        assert np.isfinite(logits[np.array([0, 2, 3])]).all()


@pytest.mark.parametrize("dilation", [1, 4])
def test_shifted_matmul_conv_matches_lax_convolution_and_its_gradients(dilation):
    x = jax.random.normal(jax.random.key(5), (B, 11, 4))
    kernel = jax.random.normal(jax.random.key(6), (3, 4, 5))

    dims = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NWC", "WIO", "NWC"))

    def conv(impl, x, kernel):
        return impl(x, kernel, (1,), "VALID", rhs_dilation=(dilation,), dimension_numbers=dims)

    def loss(impl, x, kernel):
        return jnp.sum(jnp.sin(conv(impl, x, kernel)))

    expected = conv(jax.lax.conv_general_dilated, x, kernel)
    assert expected.shape == (B, 11 - 2 * dilation, 5)
    np.testing.assert_allclose(conv(ann.shifted_matmul_conv, x, kernel), expected, atol=1e-5)
    grads = jax.grad(loss, argnums=(1, 2))
    got, want = (
        grads(ann.shifted_matmul_conv, x, kernel),
        grads(jax.lax.conv_general_dilated, x, kernel),
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)
    channels_first = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NCW", "WIO", "NCW"))
    for strides, layout in [((2,), dims), ((1,), channels_first), ((1,), None)]:
        with pytest.raises(ValueError, match="stride 1, ungrouped, channels last"):
            ann.shifted_matmul_conv(
                x, kernel, strides, "VALID", rhs_dilation=(1,), dimension_numbers=layout
            )


def test_head_dim_is_set_apart_from_width_and_lecun_init_gives_unit_variance_q():
    default = ann.build(BASE, nnx.Rngs(0)).encoder.blocks[0].attention
    assert default.head_dim == BASE.width // BASE.heads
    x = jax.random.normal(jax.random.key(3), (512, 64))
    variances = {}
    for init in ("xavier", "lecun"):
        config = dataclasses.replace(BASE, width=64, heads=3, head_dim=256, attention_init=init)
        model = ann.build(config, nnx.Rngs(0))
        attention = model.encoder.blocks[0].attention
        assert attention.query.kernel.shape == (64, 3, 256) and attention.head_dim == 256
        assert model({"inputs": TOKENS}).shape == (B, T, C)
        variances[init] = float(jnp.var(attention.query(x)))
    assert 0.9 < variances["lecun"] < 1.1  # variance 1/fan_in: unit-variance q whatever H
    assert variances["xavier"] < 0.2  # 2 / (fan_in + fan_out) shrinks q as H grows
    for values, match in [
        ({"head_dim": 0}, "head_dim"),
        ({"attention_init": "he"}, "attention_init"),
    ]:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(BASE, **values)
