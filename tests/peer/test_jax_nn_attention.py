"""JAX's own ``dot_product_attention`` tests, ported to check attnjax's drop-in claim.

Ported from ``tests/nn_test.py`` of JAX (https://github.com/jax-ml/jax, commit cec06d116c05),
the ``testDotProductAttention*`` cases, Copyright 2019 The JAX Authors, licensed under the
Apache License, Version 2.0 (https://www.apache.org/licenses/LICENSE-2.0). Rewritten for pytest;
no code is copied verbatim.

The substitution: upstream compares ``jax.nn.dot_product_attention(implementation="cudnn")``
with its XLA path. Here every case runs ``jax.nn.dot_product_attention(...)`` as the reference
and ``attnjax.attention(..., implementation=impl)`` for ``impl`` in ``("xla", "chunked",
"pallas")`` with the same arguments, and compares outputs and gradients (``jax.vjp`` with
cotangents in ``jax.nn``'s layout: ``[B, T, N, H]`` for the output and, with
``return_residual=True``, ``[B, T, N]`` for the residual, which attnjax returns in ``jax.nn``'s
layout with its gradient stopped) at JAX's tolerances. Upstream's GQA reference repeats ``K``
and ``V`` to ``N`` heads; here the reference is ``jax.nn`` with the grouped inputs themselves.

Other changes, to keep the compilations few (each costs 0.5 s to 2 s on CPU; every case shares
upstream's shape ``B, T, S, N, H = 2, 128, 128, 4, 32``, batch 1 being a slice of it):

- ``testDotProductAttention``: 4 cases instead of the product dtype x groups x vmap, covering
  float16, bfloat16 and float32 (upstream: the first two), 1, 2 and 4 groups, vmap and
  ``return_residual`` both ways (upstream checks both values in every case).
- ``testDotProductAttentionMask``: all 8 mask modes; both sides run ``return_residual=True``
  (upstream: False) so that the residual is checked under masks too. Where ``jax.nn`` gives a
  row with no visible key (a padded query) a large finite negative residual, attnjax documents
  ``-inf`` (``attention``'s docstring); those rows are checked for exactly that. The bias comes
  from its own key (upstream's ``keys[4]`` of 4 keys is clamped to ``keys[3]``, the cotangent's).
- ``testDotProductAttentionBiasGradient``: (batch 1, no vmap) and (batch 2, vmap) instead of
  batch {1, 16} x vmap {False, True}.
- ``testDotProductAttentionFloat64MaskDebugInfs`` and ``..._localWindowSizeWithoutMask``: as
  upstream, on attnjax, the window outputs also against ``jax.nn``'s.

Calls that ``jax.nn`` refuses (shapes, ranks, dtypes, heads, lengths, implementation) must
raise a ``ValueError`` or ``TypeError`` in attnjax too, except where attnjax documents a
superset: ``value`` with its own head size ``Hv`` (``[B, S, K, Hv]``) and lengths of any
integer dtype (``Int[ArrayLike, "B"]``; ``jax.nn``: int32 only).

``implementation="pallas"`` refuses dense boolean masks and ``bias`` with a ``ValueError``
naming the argument (``docs/tiled.md``, "The Pallas path refuses"); those combinations are
strict xfails. The suite runs under ``jax.numpy_rank_promotion("raise")`` (``tests/conftest.py``),
as JAX's harness does.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj

IMPLS = ("xla", "chunked", "pallas")
B, T, S, N, H = 2, 128, 128, 4, 32  # upstream's shape, shared by every case
PALLAS_REFUSES = "implementation='pallas' refuses {} with a ValueError (docs/tiled.md)"


def _close(actual, expected, rtol, atol, what):
    np.testing.assert_allclose(
        np.asarray(actual, np.float32),
        np.asarray(expected, np.float32),
        rtol=rtol,
        atol=atol,
        err_msg=what,
    )


def _pallas_refuses(*values, impl: str, refused: str | None, id: str | None = None):
    """A parameter set ``(*values, impl)``, a strict xfail where Pallas documents a refusal of
    ``refused``."""
    marks = ()
    if impl == "pallas" and refused is not None:
        reason = PALLAS_REFUSES.format(refused)
        marks = pytest.mark.xfail(strict=True, raises=ValueError, reason=reason)
    return pytest.param(*values, impl, marks=marks, id=id)


def _attnjax(impl: str):
    return functools.partial(aj.attention, implementation=impl)


def _vjp(fn, return_residual, args, grad, lse_grad):
    """``(out, residual or None, grads)``: ``fn(*args, return_residual=True)`` and its VJP at
    ``(grad, lse_grad)`` (jax.nn's layout), else ``fn(*args)`` and its VJP at ``grad``; the
    gradients of the first four arguments."""
    if return_residual:
        (out, residual), vjp = jax.vjp(functools.partial(fn, return_residual=True), *args)
        return out, residual, vjp((grad, lse_grad))[:4]
    out, vjp = jax.vjp(fn, *args)
    return out, None, vjp(grad)[:4]


# Each side compiles once per case. jax.nn's float16 reference runs eagerly: on CPU its float16
# dots (precision F16_F16_F32) are refused when compiled, and only eagerly does jax.nn fall
# back to the default precision.
_vjp_jit = jax.jit(_vjp, static_argnums=(0, 1))


def _reference(fn, return_residual, args, grad, lse_grad):
    run = _vjp if args[0].dtype == jnp.float16 else _vjp_jit
    return run(fn, return_residual, args, grad, lse_grad)


def _check(out, grads, out_ref, grads_ref, tolerances, what=""):
    """Output and gradients (with their dtypes and shapes) against jax.nn's, at JAX's
    ``(rtol, atol)`` per quantity: ``tolerances`` maps ``out``, ``dQ``, ``dK``, ``dV``,
    ``dbias``."""
    for name, got, want in zip(
        ("out", "dQ", "dK", "dV", "dbias"), (out, *grads), (out_ref, *grads_ref), strict=True
    ):
        assert (got is None) == (want is None), f"{name}{what}"
        if got is not None:
            assert got.dtype == want.dtype and got.shape == want.shape, f"{name}{what}"
            _close(got, want, *tolerances[name], f"{name}{what}")


# --- testDotProductAttention: GQA/MQA, dtypes, vmap, return_residual ---------------------

# Upstream runs the product dtype x groups x use_vmap (12 cases), each with both
# return_residual values. Each compilation costs 0.5 s (xla) to 2 s (pallas, interpreted) on
# CPU, so here 4 cases cover each factor: every dtype, every group size (1: MHA, 2: GQA,
# 4: MQA), vmap and return_residual both ways. With return_residual=True the VJP takes a
# cotangent for the residual too, which must change nothing (its gradient is stopped).
GQA_CASES = [
    # dtype, groups (N // K), use_vmap, return_residual
    ("bfloat16", 1, False, True),
    ("bfloat16", 4, True, False),
    ("float16", 2, True, True),
    ("float32", 4, False, True),
]
GQA_TOLERANCES = dict.fromkeys(("out", "dQ", "dK", "dV", "dbias"), (0.01, 0.01))


@functools.cache
def _gqa_inputs(dtype: str, groups: int):
    keys = jax.random.split(jax.random.key(0), 5)
    dtype = jnp.dtype(dtype)
    q = jax.random.normal(keys[0], (B, T, N, H), dtype)
    k = jax.random.normal(keys[1], (B, S, N // groups, H), dtype)
    v = jax.random.normal(keys[2], (B, S, N // groups, H), dtype)
    grad = jax.random.normal(keys[3], (B, T, N, H), dtype)
    lse_grad = jax.random.normal(keys[4], (B, T, N), dtype)
    return (q, k, v, None, None), grad, lse_grad


def _gqa_reference(dtype: str, groups: int, return_residual: bool):
    fn = jax.nn.dot_product_attention
    return _reference(fn, return_residual, *_gqa_inputs(dtype, groups))


def _vmapped(fn):
    """``fn`` per example (unbatched ``[T, N, H]`` inputs); ``bias`` and ``mask`` shared."""

    def call(q, k, v, bias, mask, **options):
        per_example = functools.partial(fn, **options)
        return jax.vmap(per_example, in_axes=(0, 0, 0, None, None))(q, k, v, bias, mask)

    return call


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype, groups, use_vmap, return_residual", GQA_CASES)
def test_dot_product_attention(dtype, groups, use_vmap, return_residual, impl):
    fn = _attnjax(impl)
    if use_vmap:
        fn = _vmapped(fn)
    out, residual, grads = _vjp_jit(fn, return_residual, *_gqa_inputs(dtype, groups))
    out_ref, residual_ref, grads_ref = _gqa_reference(dtype, groups, return_residual)

    _check(out, grads, out_ref, grads_ref, GQA_TOLERANCES)
    if return_residual:
        assert residual.dtype == residual_ref.dtype and residual.shape == (B, T, N)
        _close(residual, residual_ref, 0.01, 0.01, "residual")


# --- testDotProductAttentionMask: bias, causal, padding, custom mask, sliding window -------

MASK_MODES = [
    ("bias",),
    ("causal",),
    ("padding",),
    ("custom",),
    ("causal", "padding"),
    ("custom", "padding"),
    ("bias", "causal"),
    ("causal", "sliding_window"),
]


def _mask_refused(mode) -> str | None:
    if "custom" in mode:
        return "a dense boolean mask"
    if "bias" in mode:
        return "a bias"
    return None


@functools.cache
def _mask_case(mode: tuple[str, ...]):
    """``(args, options, grad, lse_grad)`` as upstream builds them; ``args`` ends with the
    query and key lengths, passed positionally as upstream does."""
    dtype = jnp.bfloat16
    keys = jax.random.split(jax.random.key(0), 6)
    q = jax.random.normal(keys[0], (B, T, N, H), dtype)
    k = jax.random.normal(keys[1], (B, S, N, H), dtype)
    v = jax.random.normal(keys[2], (B, S, N, H), dtype)
    grad = jax.random.normal(keys[3], (B, T, N, H), dtype)
    lse_grad = jax.random.normal(keys[5], (B, T, N), dtype)
    bias = mask = q_lengths = kv_lengths = window = None
    is_causal = "causal" in mode
    if "padding" in mode:
        q_lengths = jnp.array([T // 2, T // 4], jnp.int32)
        kv_lengths = jnp.array([S // 4, S // 2], jnp.int32)
    if "custom" in mode:  # a causal mask given as a dense one
        mask = jnp.tril(jnp.ones((T, S), bool))[None, None]
    if "bias" in mode:
        bias = jax.random.normal(keys[4], (1, N, T, S), dtype)
    if "sliding_window" in mode:
        window = (3, 2) if is_causal else (3, 0)
    options = {"is_causal": is_causal, "local_window_size": window}
    return (q, k, v, bias, mask, q_lengths, kv_lengths), options, grad, lse_grad


class _WithLengths:
    """``fn`` with the lengths as positional arguments (so ``jax.vjp`` takes them, as
    upstream's does) and the other options fixed; hashable, for ``jax.jit``."""

    def __init__(self, fn, options):
        self.fn, self.options = fn, options

    def __call__(self, q, k, v, bias, mask, q_lengths, kv_lengths, **more):
        return self.fn(
            q,
            k,
            v,
            bias,
            mask,
            query_seq_lengths=q_lengths,
            key_value_seq_lengths=kv_lengths,
            **self.options,
            **more,
        )


@functools.cache
def _mask_reference(mode):
    args, options, grad, lse_grad = _mask_case(mode)
    fn = _WithLengths(jax.nn.dot_product_attention, options)
    return _reference(fn, True, args, grad, lse_grad)


MASK_TOLERANCES = {
    "out": (0.01, 0.01),
    "dQ": (0.02, 0.02),
    "dK": (0.02, 0.02),
    "dV": (0.01, 0.01),
    "dbias": (0.02, 0.02),
}


@pytest.mark.parametrize(
    "mode, impl",
    [
        _pallas_refuses(mode, impl=impl, refused=_mask_refused(mode), id=f"{'+'.join(mode)}-{impl}")
        for mode in MASK_MODES
        for impl in IMPLS
    ],
)
def test_dot_product_attention_mask(mode, impl):
    # Upstream runs return_residual=False; here both sides run True, so the residual is
    # checked too (its gradient is stopped: the output and gradients are those of False).
    args, options, grad, lse_grad = _mask_case(mode)
    fn = _WithLengths(_attnjax(impl), options)
    out, residual, grads = _vjp_jit(fn, True, args, grad, lse_grad)
    out_ref, residual_ref, grads_ref = _mask_reference(mode)
    _check(out, grads, out_ref, grads_ref, MASK_TOLERANCES)

    # Rows with no visible key (padded queries): jax.nn's residual is a large finite negative,
    # attnjax's is -inf (documented); every other row matches.
    empty = np.isneginf(np.asarray(residual, np.float32))
    if "padding" in mode:
        q_lengths = np.asarray(_mask_case(mode)[0][5])
        padded = np.arange(T)[None, :, None] >= q_lengths[:, None, None]
        np.testing.assert_array_equal(empty, np.broadcast_to(padded, empty.shape))
        assert np.all(np.asarray(residual_ref, np.float32)[empty] < -1e30)
    else:
        assert not empty.any()
    _close(np.where(empty, 0, residual), np.where(empty, 0, residual_ref), 0.01, 0.01, "residual")


# --- testDotProductAttentionBiasGradient ---------------------------------------------------


@functools.cache
def _bias_inputs(batch_size: int):
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (B, S, N, H), jnp.bfloat16)[:batch_size]
    bias = jax.random.normal(keys[1], (B, N, S, S), jnp.bfloat16)[:batch_size]
    mask = jnp.ones((1, 1, S), bool)
    return x, bias, mask


def _self_attention(fn):
    def call(x, bias, mask):
        return fn(query=x, key=x, value=x, bias=bias, mask=mask, is_causal=False)

    return call


def _bias_run(fn, use_vmap, x, bias, mask):
    """Upstream's forward (per example under vmap) and bias gradient (batched), one jit."""
    fn = _self_attention(fn)
    forward = jax.vmap(fn, in_axes=(0, 0, None)) if use_vmap else fn

    @jax.jit
    def run(x, bias, mask):
        _, vjp = jax.vjp(fn, x, bias, mask)
        return forward(x, bias, mask), vjp(x)[1]

    return run(x, bias, mask)


@functools.cache
def _bias_reference(batch_size, use_vmap):
    return _bias_run(jax.nn.dot_product_attention, use_vmap, *_bias_inputs(batch_size))


@pytest.mark.parametrize(
    "batch_size, use_vmap, impl",
    [
        _pallas_refuses(b, vmap, impl=impl, refused="a bias")
        for b, vmap in ((1, False), (2, True))
        for impl in IMPLS
    ],
)
def test_dot_product_attention_bias_gradient(batch_size, use_vmap, impl):
    # Upstream's mask [1, 1, S] is 3-D: jax.nn prefixes size-1 axes to make it [1, 1, 1, S];
    # under vmap it is unbatched, broadcasting to [N, T, S].
    y_ref, dbias_ref = _bias_reference(batch_size, use_vmap)
    y, dbias = _bias_run(_attnjax(impl), use_vmap, *_bias_inputs(batch_size))
    _close(y, y_ref, 1e-2, 1e-2, "output")  # JAX's default bfloat16 tolerance
    _close(dbias, dbias_ref, 0.1, 0.1, "dbias")


# --- testDotProductAttentionFloat64MaskDebugInfs -------------------------------------------


@pytest.mark.parametrize(
    "impl", [_pallas_refuses(impl=impl, refused="a dense boolean mask") for impl in IMPLS]
)
def test_dot_product_attention_float64_mask_debug_infs(impl):
    # Regression test for jax-ml/jax#37422: a masked float64 call under debug_infs must not
    # produce an inf anywhere, nor warn. Unbatched inputs and a 1-D mask over the keys.
    t, s, k, n, h = 5, 7, 3, 6, 11
    with jax.enable_x64(True):
        mask = jnp.arange(s) <= s // 2
        zeros = functools.partial(jnp.zeros, dtype=jnp.float64)
        with jax.debug_infs(True), warnings.catch_warnings():
            warnings.simplefilter("error")
            out = aj.attention(
                zeros((t, n, h)), zeros((s, k, h)), zeros((s, k, h)), mask=mask, implementation=impl
            )
            out.block_until_ready()
        assert out.shape == (t, n, h) and out.dtype == jnp.float64
        np.testing.assert_array_equal(out, 0.0)


# --- testDotProductAttention_localWindowSizeWithoutMask -------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _two_windows(fn, q, k, v):
    return tuple(fn(q, k, v, mask=None, local_window_size=w) for w in ((32, 32), (1, 1)))


@pytest.mark.parametrize("impl", IMPLS)
def test_dot_product_attention_local_window_size_without_mask(impl):
    (q, k, v, _, _), _, _ = _gqa_inputs("float32", 1)
    large, small = _two_windows(_attnjax(impl), q, k, v)
    assert not jnp.allclose(large, small), "local_window_size must matter without a mask"
    large_ref, small_ref = _window_reference()
    _close(large, large_ref, 1e-5, 1e-5, "window (32, 32)")
    _close(small, small_ref, 1e-5, 1e-5, "window (1, 1)")


@functools.cache
def _window_reference():
    (q, k, v, _, _), _, _ = _gqa_inputs("float32", 1)
    return _two_windows(jax.nn.dot_product_attention, q, k, v)


# --- calls jax.nn refuses ------------------------------------------------------------------


@functools.cache
def _bad_calls():
    f32 = jnp.float32
    q = jnp.zeros((B, 8, N, H), f32)
    k = jnp.zeros((B, 8, 2, H), f32)
    lengths = jnp.full((B,), 4, jnp.int32)
    return {
        "value-shape": ((q, k, jnp.zeros((B, 6, 2, H), f32)), {}),
        "value-batch": ((q, k, jnp.zeros((1, 8, 2, H), f32)), {}),
        "value-dtype": ((q, k, k.astype(jnp.bfloat16)), {}),
        "query-head-size": ((jnp.zeros((B, 8, N, 16), f32), k, k), {}),
        "query-batch": ((jnp.zeros((3, 8, N, H), f32), k, k), {}),
        "query-rank-5": ((q[None], k, k), {}),
        "query-dtype": ((q.astype(jnp.bfloat16), k, k), {}),
        "heads-not-multiple": ((jnp.zeros((B, 8, 3, H), f32), k, k), {}),
        "mask-not-bool": ((q, k, k), {"mask": jnp.ones((1, 1, 8, 8), f32)}),
        "mask-rank-5": ((q, k, k), {"mask": jnp.ones((1, 1, 1, 8, 8), bool)}),
        "bias-rank-5": ((q, k, k), {"bias": jnp.ones((1, 1, 1, 8, 8), f32)}),
        "q-lengths-shape": ((q, k, k), {"query_seq_lengths": jnp.full((3,), 4, jnp.int32)}),
        "q-lengths-float": ((q, k, k), {"query_seq_lengths": lengths.astype(f32)}),
        "kv-lengths-shape": ((q, k, k), {"key_value_seq_lengths": lengths[:1]}),
        "kv-lengths-float": ((q, k, k), {"key_value_seq_lengths": lengths.astype(f32)}),
        "implementation": ((q, k, k), {"implementation": "flash"}),
    }


BAD_CALLS = (
    "value-shape",
    "value-batch",
    "value-dtype",
    "query-head-size",
    "query-batch",
    "query-rank-5",
    "query-dtype",
    "heads-not-multiple",
    "mask-not-bool",
    "mask-rank-5",
    "bias-rank-5",
    "q-lengths-shape",
    "q-lengths-float",
    "kv-lengths-shape",
    "kv-lengths-float",
    "implementation",
)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", BAD_CALLS)
def test_refuses_what_jax_nn_refuses(case, impl):
    # Traced only (jax.eval_shape): the refusals are checks of shapes and dtypes.
    args, options = _bad_calls()[case]
    with pytest.raises((ValueError, TypeError)):
        jax.eval_shape(lambda: jax.nn.dot_product_attention(*args, **options))
    options = {"implementation": impl, **options}
    with pytest.raises((ValueError, TypeError)):
        jax.eval_shape(lambda: aj.attention(*args, **options))
