"""``attention`` semantics: order of operations, scores, invariances, masked rows, errors."""

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

import attnjax as aj
from attnjax import scores

B, T, S, N, K, H = 2, 6, 6, 4, 2, 8
_keys = jax.random.split(jax.random.key(1), 5)
Q = jax.random.normal(_keys[0], (B, T, N, H))
KEY = jax.random.normal(_keys[1], (B, S, K, H))
V = jax.random.normal(_keys[2], (B, S, K, H))
BIAS = jax.random.normal(_keys[3], (B, N, T, S))
ADDITIVE = {
    "w_q": jax.random.normal(_keys[4], (N, H, 5)) / 3,
    "w_k": jax.random.normal(_keys[0], (N, H, 5)) / 3,
    "v": jnp.linspace(-1, 1, 5),
    "b": jnp.full((5,), 0.1),
}


def _manual(logits, v=V):
    """softmax(logits [B, N, T, S]) @ v with key/value heads repeated for GQA."""
    v = jnp.repeat(v, N // v.shape[2], axis=2)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, -1), v)


def _heads_q(q):
    """[B, T, N, H] -> [B, N, T, H]."""
    return q.swapaxes(1, 2)


def _heads(x):
    """[B, L, K, H] -> [B, N, L, H] with key/value heads repeated."""
    return jnp.repeat(x, N // x.shape[2], axis=2).swapaxes(1, 2)


@pytest.mark.parametrize(
    "score, params, logits_fn",
    [
        ("dot", None, lambda q, k: scores.dot(q, k)),
        (
            "cosine",
            {"scale": jnp.arange(1.0, N + 1)},
            lambda q, k: scores.cosine(q, k, jnp.arange(1.0, N + 1)),
        ),
        ("bilinear", {"w": jnp.eye(H) * 0.5}, lambda q, k: 0.5 * scores.dot(q, k)),
        ("additive", ADDITIVE, lambda q, k: scores.additive(q, k, **ADDITIVE)),
    ],
)
def test_named_scores_follow_bias_then_temperature_order(score, params, logits_fn):
    out = aj.attention(Q, KEY, V, BIAS, score=score, score_params=params, temperature=2.5)
    expected = _manual((logits_fn(_heads_q(Q), _heads(KEY)) + BIAS) / 2.5)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_scaled_dot_default_scale_and_explicit_scale():
    logits = scores.dot(_heads_q(Q), _heads(KEY))
    np.testing.assert_allclose(aj.attention(Q, KEY, V), _manual(logits / np.sqrt(H)), atol=1e-5)
    np.testing.assert_allclose(aj.attention(Q, KEY, V, scale=0.2), _manual(logits * 0.2), atol=1e-5)


def test_callable_score_equals_named_and_is_not_rescaled():
    def my_score(q, k, params):
        return scores.bilinear(q, k, params["w"])

    w = jax.random.normal(_keys[4], (H, H))
    out = aj.attention(Q, KEY, V, score=my_score, score_params={"w": w})
    np.testing.assert_allclose(
        out, aj.attention(Q, KEY, V, score="bilinear", score_params={"w": w}), atol=1e-6
    )
    dot_out = aj.attention(Q, KEY, V, score=lambda q, k, p: scores.dot(q, k))
    np.testing.assert_allclose(dot_out, aj.attention(Q, KEY, V, score="dot"), atol=1e-6)


def test_score_param_gradients_match_finite_differences_under_jit():
    def f(w_q, w_k, v, b):
        params = {"w_q": w_q, "w_k": w_k, "v": v, "b": b}
        out = aj.attention(
            Q[:1, :3], KEY[:1, :4], V[:1, :4], score="additive", score_params=params, is_causal=True
        )
        return jnp.sum(out * jnp.cos(out))

    args = tuple(ADDITIVE[k] for k in ("w_q", "w_k", "v", "b"))
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(*args)
    eps = 1e-2
    for i, (x, g) in enumerate(zip(args, grads, strict=True)):
        direction = jax.random.normal(jax.random.key(i), x.shape)

        def along(t, i=i, x=x, direction=direction):
            return f(*args[:i], x + t * direction, *args[i + 1 :])

        numeric = (along(eps) - along(-eps)) / (2 * eps)  # central difference
        analytic = jnp.vdot(g, direction)
        assert abs(numeric - analytic) <= 2e-2 * max(1.0, abs(analytic)), (i, numeric, analytic)
        assert abs(analytic) > 1e-3  # every parameter does move the output


def test_temperature_equals_scale_for_scaled_dot_and_is_traceable():
    out = jax.jit(lambda t: aj.attention(Q, KEY, V, temperature=t))(4.0)
    np.testing.assert_allclose(out, aj.attention(Q, KEY, V, scale=1 / (4.0 * np.sqrt(H))), 1e-5)


def test_permutation_equivariance_without_masks():
    perm_q, perm_k = np.array([3, 0, 5, 1, 4, 2]), np.array([2, 5, 0, 4, 1, 3])
    out = aj.attention(Q, KEY, V)
    np.testing.assert_allclose(aj.attention(Q[:, perm_q], KEY, V), out[:, perm_q], atol=1e-5)
    np.testing.assert_allclose(aj.attention(Q, KEY[:, perm_k], V[:, perm_k]), out, atol=1e-5)


def test_causal_outputs_ignore_the_future_and_gradients_are_lower_triangular():
    out = aj.attention(Q, KEY, V, is_causal=True)
    for i in range(T):
        changed = aj.attention(
            Q.at[:, i + 1 :].set(7.0),
            KEY.at[:, i + 1 :].set(-3.0),
            V.at[:, i + 1 :].set(9.0),
            is_causal=True,
        )
        np.testing.assert_allclose(changed[:, : i + 1], out[:, : i + 1], atol=1e-5)
    # The gradient with respect to an additive bias is d(loss)/d(logits).
    dlogits = jax.grad(lambda b: (aj.attention(Q, KEY, V, b, is_causal=True) ** 2).sum())(BIAS)
    nonzero = np.abs(np.asarray(dlogits)) > 0
    assert not nonzero[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]].any()
    # T(T+1)/2 positions may be non-zero; row 0 has one visible key, so its weight is the
    # constant 1 and its logit gradient is exactly 0: every other lower entry is non-zero.
    lower = np.tril(np.ones((T, T), bool))
    lower[0, 0] = False
    np.testing.assert_array_equal(nonzero, np.broadcast_to(lower, nonzero.shape))


def test_padding_content_does_not_change_valid_outputs():
    lengths = jnp.array([4, 2], jnp.int32)
    out = aj.attention(Q, KEY, V, key_value_seq_lengths=lengths)
    pad = jnp.arange(S)[None, :, None, None] >= lengths[:, None, None, None]
    changed = aj.attention(
        Q, jnp.where(pad, 100.0, KEY), jnp.where(pad, -5.0, V), key_value_seq_lengths=lengths
    )
    np.testing.assert_allclose(changed, out, atol=1e-6)


@pytest.mark.parametrize("score", ["scaled_dot", "cosine", "additive"])
def test_rows_without_visible_keys_give_zero_output_and_zero_gradients(score):
    params = ADDITIVE if score == "additive" else None
    mask = jnp.ones((B, N, T, S), bool).at[0, :, 2].set(False)
    kwargs = dict(
        mask=mask,
        key_value_seq_lengths=jnp.array([S, 0], jnp.int32),
        score=score,
        score_params=params,
    )

    def loss(q, k, v):
        return (aj.attention(q, k, v, **kwargs) ** 2).sum()

    out, weights = aj.attention(Q, KEY, V, return_weights=True, **kwargs)
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(weights[1], 0.0)
    gq, gk, gv = jax.grad(loss, (0, 1, 2))(Q, KEY, V)
    assert all(np.isfinite(g).all() for g in (gq, gk, gv))
    np.testing.assert_array_equal(gq[0, 2], 0.0)
    np.testing.assert_array_equal(gq[1], 0.0)
    np.testing.assert_array_equal(gk[1], 0.0)
    np.testing.assert_array_equal(gv[1], 0.0)


def test_decoding_offset_matches_last_row_of_full_causal():
    full = aj.attention(Q, KEY, V, is_causal=True)
    last = aj.attention(Q[:, -1:], KEY, V, is_causal=True, causal_offset=S - 1)
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-6)


def test_segments_block_attention_across_packed_sequences():
    seg = jnp.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    out = aj.attention(Q, KEY, V, q_segment_ids=seg, kv_segment_ids=seg)
    first = aj.attention(Q[:1, :3], KEY[:1, :3], V[:1, :3])
    np.testing.assert_allclose(out[:1, :3], first, atol=1e-6)


def test_bfloat16_inputs_return_bfloat16_and_finite_under_large_logits():
    q = (Q * 300).astype(jnp.bfloat16)
    out = aj.attention(q, KEY.astype(jnp.bfloat16), V.astype(jnp.bfloat16), score="dot")
    assert out.dtype == jnp.bfloat16 and np.isfinite(out.astype(jnp.float32)).all()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(query=Q[0, 0]), ValueError, "ranks"),
        (dict(key=KEY[:1]), ValueError, "batch"),
        (dict(value=V[:, :3]), ValueError, "key, value"),
        (dict(key=KEY[..., :4], value=V[..., :4]), ValueError, "head size"),
        (dict(key=jnp.ones((B, S, 3, H)), value=jnp.ones((B, S, 3, H))), ValueError, "multiple"),
        (dict(mask=jnp.ones((B, N, T, S + 1), bool)), ValueError, "mask"),
        (dict(mask=jnp.ones((B, N, T, S))), TypeError, "boolean"),
        (dict(bias=jnp.ones((3, N, T, S))), ValueError, "bias"),
        (dict(score="nope"), ValueError, "score"),
        (dict(score="bilinear"), ValueError, "missing"),
        (dict(score="bilinear", score_params={"w": jnp.ones((H, H + 1))}), ValueError, "'w'"),
        (dict(score="additive", score_params={**ADDITIVE, "v": jnp.ones(6)}), ValueError, "'v'"),
        (dict(score="cosine", score_params={"sclae": 1.0}), ValueError, "unknown"),
        (dict(score="cosine", scale=2.0), ValueError, "scale"),
        (dict(temperature=0.0), ValueError, "temperature"),
        (dict(temperature=jnp.array([1.0, -1.0])), ValueError, "temperature"),
        (dict(query_seq_lengths=jnp.ones(3, jnp.int32)), ValueError, "query_seq_lengths"),
        (dict(key_value_seq_lengths=jnp.ones(B)), ValueError, "key_value_seq_lengths"),
        (dict(q_segment_ids=jnp.zeros((B, T), jnp.int32)), ValueError, "both"),
        (dict(local_window_size=(1, -2)), ValueError, "local_window_size"),
        (dict(implementation="fast"), ValueError, "implementation"),
    ],
)
def test_bad_inputs_raise_errors_naming_the_argument(kwargs, error, match):
    """Our own error, or (where the suite runs jaxtyping's runtime checks of the annotated
    shapes and dtypes) its ``TypeCheckError``, which names the same argument."""
    args = {"query": Q, "key": KEY, "value": V} | kwargs
    argument = next(iter(kwargs))
    with pytest.raises((error, jaxtyping.TypeCheckError), match=rf"{match}|parameter '{argument}'"):
        aj.attention(**args)


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_every_implementation_differentiates_inside_scan(implementation):
    """Scanned layers differentiate attention inside ``lax.scan`` (the default scale is a
    Python float: score parameters must be arrays by the time a custom VJP sees them)."""

    def layers(implementation):
        def layer(x, _):
            return aj.attention(x, x, x, is_causal=True, implementation=implementation), None

        return lambda q: jnp.sum(jax.lax.scan(layer, q, None, length=2)[0] ** 2)

    grads = jax.jit(jax.grad(layers(implementation)))(Q)
    np.testing.assert_allclose(grads, jax.grad(layers("xla"))(Q), atol=1e-4)


def test_choose_implementation_on_a_tpu_backend(monkeypatch):
    """On TPU the Mosaic kernel ("pallas") wherever it takes the call; "chunked" where it
    refuses: float16, a dense mask, a mod that does not lower for TPU."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    long = jnp.zeros((1, 1024, 2, 8))
    assert aj.choose_implementation(Q, KEY, V) == "xla"  # few logits: dense, as elsewhere
    assert aj.choose_implementation(long, long, long, is_causal=True) == "pallas"
    half = long.astype(jnp.float16)
    assert aj.choose_implementation(half, half, half) == "chunked"
    dense_mask = jnp.ones((1, 1, 1024, 1024), bool)
    assert aj.choose_implementation(long, long, long, mask=dense_mask) == "chunked"

    def row_read(logits, b, h, q_idx, kv_idx, params):  # loads a vector from SMEM
        return logits + params["table"][h, :][kv_idx % 4]

    table = {"table": jnp.zeros((2, 4))}
    chosen = aj.choose_implementation(long, long, long, score_mod=row_read, mod_params=table)
    assert chosen == "chunked"


def test_choose_implementation_and_cudnn_refusals():
    long = jnp.zeros((1, 1024, 2, 8))
    assert aj.choose_implementation(Q, KEY, V) == "xla"
    assert aj.choose_implementation(long, long, long, return_weights=True) == "xla"
    on_gpu = jax.default_backend() == "gpu"
    assert aj.choose_implementation(long, long, long) == ("cudnn" if on_gpu else "chunked")
    additive = {"w_q": jnp.ones((8, 4)), "w_k": jnp.ones((8, 4)), "v": jnp.ones(4)}
    chosen = aj.choose_implementation(long, long, long, score="additive", score_params=additive)
    assert chosen == ("pallas" if on_gpu else "chunked")
    if not on_gpu:
        with pytest.raises(ValueError, match=r"cudnn.*a GPU"):
            aj.attention(Q, KEY, V, implementation="cudnn")
    with pytest.raises(ValueError, match=r"cudnn.*'dot' or 'scaled_dot'"):
        aj.attention(Q, KEY, V, score="cosine", implementation="cudnn")
    with pytest.raises(ValueError, match=r"cudnn.*score_mod"):
        aj.attention(Q, KEY, V, score_mod=lambda s, *_: s, implementation="cudnn")
