"""Flax's contract for ``MultiHeadAttention`` and ``attention_fn``, against Flax's own module:
leading batch dimensions (none, one, two) in calls and decoding, every constructor and call
argument, ``nnx.view``, ``nnx.split`` filters and default initializers."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann

T, D = 5, 16
X = jax.random.normal(jax.random.key(0), (2, 3, T, D))  # two batch dimensions
MASK = jax.random.bernoulli(jax.random.key(1), 0.7, (2, 3, 1, T, T)) | jnp.eye(T, dtype=bool)
BATCHES = {"none": (), "one": (6,), "two": (2, 3)}


def _rows(x, shape):
    """The first ``prod(shape)`` rows of ``x`` (batch dimensions ``(2, 3)``) as ``shape``."""
    return x.reshape(6, *x.shape[2:])[: int(np.prod(shape))].reshape(*shape, *x.shape[2:])


def _pair(**options):
    """Flax's module and ours, both from the same seed with Flax's default initializers."""
    ref = nnx.MultiHeadAttention(4, D, decode=False, rngs=nnx.Rngs(1), **options)
    return ann.MultiHeadAttention(4, D, rngs=nnx.Rngs(1), **options), ref


def test_default_initializers_are_flaxs_so_the_same_seed_gives_the_same_weights():
    ours, ref = _pair(normalize_qk=True)
    ours, ref = (nnx.to_pure_dict(nnx.state(m, nnx.Param)) for m in (ours, ref))
    jax.tree.map(np.testing.assert_array_equal, ours, ref)


@pytest.mark.parametrize("batch", list(BATCHES))
def test_any_leading_batch_dimensions_give_flaxs_output(batch):
    ours, ref = _pair()
    shape = BATCHES[batch]
    x, mask = _rows(X, shape), _rows(MASK, shape)
    np.testing.assert_allclose(ours(x, mask=mask), ref(x, mask=mask), atol=1e-5)
    out, weights = ours(x, mask=mask, return_weights=True)
    assert out.shape == (*shape, T, D) and weights.shape == (*shape, 4, T, T)


def test_two_batch_dimensions_fold_to_the_same_rows_as_one():
    ours, _ = _pair()
    folded = ours(X.reshape(6, T, D), mask=MASK.reshape(6, 1, T, T), is_causal=True)
    unfolded = ours(X, mask=MASK, is_causal=True)
    np.testing.assert_array_equal(unfolded.reshape(6, T, D), folded)
    with pytest.raises(ValueError, match=r"inputs_k: batch dimensions \(6,\)"):
        ours(X, X.reshape(6, T, D))


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_attention_fn_takes_any_leading_batch_dimensions(batch, implementation):
    shape = BATCHES[batch]
    q, k, v = (jax.random.normal(jax.random.key(i), (*shape, T, 4, 8)) for i in range(3))
    masking = {"is_causal": True} if implementation == "pallas" else {"mask": _rows(MASK, shape)}
    fn = ann.attention_fn(implementation=implementation)
    expected = nnx.dot_product_attention(q, k, v, **masking)
    np.testing.assert_allclose(fn(q, k, v, **masking), expected, atol=1e-5)


@pytest.mark.parametrize("batch", list(BATCHES))
def test_decoding_with_any_batch_dimensions_equals_flax(batch):
    shape = BATCHES[batch]
    ours, ref = _pair(num_kv_heads=2)
    x = _rows(X, shape)
    for module in (ours, ref):
        module.init_cache(x.shape)
    for t in range(T):
        step = x[..., t : t + 1, :]
        np.testing.assert_allclose(ours(step, decode=True), ref(step, decode=True), atol=1e-5)
    with pytest.raises(ValueError, match="batch dimensions"):
        ours(X[:1, :1, :1], decode=True)


def test_view_sets_deterministic_and_builds_the_decoding_cache():
    ours, _ = _pair(dropout_rate=0.5)
    x = X[0]
    assert not np.allclose(ours(x), ours(x, deterministic=True))
    evaluated = nnx.view(ours, deterministic=True)
    np.testing.assert_array_equal(evaluated(x), ours(x, deterministic=True))
    assert ours.deterministic is None  # the view is a copy
    decoding = nnx.view(ours, deterministic=True, decode=True, batch_size=3, max_length=T)
    assert decoding.cached_key.shape == (3, T, 4, 4)
    steps = [decoding(x[:, t : t + 1]) for t in range(T)]
    full = ours(x, is_causal=True, deterministic=True)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)
    with pytest.raises(TypeError, match="batch_size, max_length"):
        nnx.view(ours, decode=True)


def test_split_by_param_is_exhaustive_as_on_flaxs_module():
    ours, ref = _pair(dropout_rate=0.1, keep_rngs=False)
    for module in (ours, ref):
        assert len(nnx.split(module, nnx.Param)) == 2  # no state left outside the filter
    gated = ann.add_head_gates(ours)
    _, _, gates = nnx.split(gated, nnx.Param, ann.HeadGate)
    assert jax.tree.leaves(gates)[0].shape == (4,)
    with pytest.raises(ValueError, match="Non-exhaustive"):
        nnx.split(gated, nnx.Param)


def test_every_argument_of_flaxs_module_is_taken_under_its_name():
    for method in ("__init__", "__call__", "init_cache", "set_view"):
        flax_params = inspect.signature(getattr(nnx.MultiHeadAttention, method)).parameters
        ours = inspect.signature(getattr(ann.MultiHeadAttention, method)).parameters
        assert set(flax_params) <= set(ours), set(flax_params) - set(ours)
        for name, param in flax_params.items():
            assert ours[name].kind == param.kind, name


def test_flaxs_projection_arguments_reach_the_projections():
    calls = []

    def counting(lhs, rhs, *args, **kwargs):
        calls.append(lhs.shape)
        return jax.lax.dot_general(lhs, rhs, *args, **kwargs)

    def promote(arrays, dtype=None, inexact=True):
        calls.append("promote")
        return nnx.nn.dtypes.promote_dtype(arrays, dtype=dtype, inexact=inexact)

    options = {"qkv_dot_general": counting, "out_promote_dtype": promote,
               "kernel_metadata": {"note": "projection"}}  # fmt: skip
    ours, ref = _pair(**options)
    x = X[0]
    np.testing.assert_array_equal(ours(x, qkv_sharding=None, out_sharding=None), ref(x))
    assert calls.count("promote") == 2 and len(calls) == 8  # per module: 3 q/k/v, 1 out
    assert ours.query.kernel.get_metadata()["note"] == "projection"


def test_attention_fn_replaces_attnjaxs_attention_as_in_flax():
    ours, ref = _pair(attention_fn=nnx.dot_product_attention, dropout_rate=0.2)
    x, mask = X[0], MASK[0]
    outs = [m(x, mask=mask, deterministic=False, rngs=nnx.Rngs(dropout=3)) for m in (ours, ref)]
    np.testing.assert_array_equal(*outs)
    with pytest.raises(ValueError, match="score: does not apply with attention_fn"):
        ann.MultiHeadAttention(4, D, attention_fn=nnx.dot_product_attention, score="additive",
                               rngs=nnx.Rngs(0))  # fmt: skip
    with pytest.raises(ValueError, match=r"return_weights.*attention_fn"):
        ours(x, return_weights=True)
    for module in (ours, ref):
        module.init_cache(x.shape)
    steps = [ours(x[:, t : t + 1], decode=True, deterministic=True) for t in range(T)]
    full = ref(x, mask=nnx.make_causal_mask(x[..., 0]), deterministic=True)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_input_positions_are_rope_positions_or_reach_attention_fn():
    x, positions = X[0], jnp.arange(T)[::-1]
    rotary = ann.MultiHeadAttention(4, D, rope=True, rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(
        rotary(x, input_positions=positions), rotary(x, positions=positions)
    )
    with pytest.raises(ValueError, match=r"input_positions: .* rope=False"):
        _pair()[0](x, input_positions=positions)
    seen = {}

    def recording(query, key, value, *, input_positions=None, is_causal=False, **flax_args):
        seen.update(positions=input_positions, is_causal=is_causal)
        return nnx.dot_product_attention(query, key, value, mask=flax_args["mask"])

    module = ann.MultiHeadAttention(4, D, attention_fn=recording, rngs=nnx.Rngs(1))
    module(x, input_positions=positions)
    np.testing.assert_array_equal(seen["positions"], positions)
    module.init_cache(x.shape)
    module(x[:, :1], decode=True, is_causal=True)  # the cache's mask is causal already
    assert seen == {"positions": None, "is_causal": False}
