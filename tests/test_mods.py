"""Score and mask mods (``attnjax.mods``) against dense references built with plain ``bias``,
``mask`` and callable scores, forward and gradients, on every implementation (Pallas in
interpret mode on a CPU), and the Pallas kernels' CUDA lowering of every gallery entry.

Queries sit at the end of the keys (``causal_offset = S - T``), so a mod that mixed up
tile-local and absolute indices would fail.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from attnjax import mods, scores
from attnjax.call import AttentionCall
from attnjax.pallas.mods import lowering_error
from tests.parity import FP32_FWD, FP32_GRAD, max_rel_error, qkv

B, T, S, N, K, H = 2, 13, 21, 4, 2, 8
OFFSET = S - T
TILES = aj.BlockSizes(4, 8)
Q_POS = np.arange(T)[:, None] + OFFSET  # queries in key coordinates
K_POS = np.arange(S)[None, :]
DOC_IDS = np.repeat(np.array([[0, 1, 2], [5, 6, 7]]), [6, 9, 6], axis=1)  # [B, S]
PREFIX = np.array([12, 0])
BUCKETS = dict(num_buckets=8, max_distance=16)


def _t5_bucket(relative: int, num_buckets: int, max_distance: int, bidirectional: bool) -> int:
    """T5's bucketing written out for one integer (the published algorithm, scalar form)."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative > 0 else 0
        relative = abs(relative)
    else:
        relative = max(-relative, 0)
    exact = num_buckets // 2
    if relative < exact:
        return bucket + relative
    large = exact + int(
        np.log(relative / exact) / np.log(max_distance / exact) * (num_buckets - exact)
    )
    return bucket + min(large, num_buckets - 1)


def _table_bias(table, bidirectional):
    buckets = np.vectorize(functools.partial(_t5_bucket, bidirectional=bidirectional, **BUCKETS))
    return table[:, buckets(K_POS - Q_POS)]  # [N, T, S]


RNG = np.random.default_rng(0)
SLOPES = jnp.asarray(RNG.uniform(0.1, 1.0, N), jnp.float32)
TABLE = jnp.asarray(RNG.normal(size=(N, BUCKETS["num_buckets"])), jnp.float32)
CAUSAL = K_POS <= Q_POS
WINDOW = (K_POS >= Q_POS - 3) & (K_POS <= Q_POS + 2)

# name: (mod kwargs for attention, mod_params, reference kwargs as a function of mod_params)
CASES = {
    "alibi": (
        {"score_mod": mods.alibi(N)},
        {},
        lambda p: {"bias": -mods.alibi_slopes(N)[:, None, None] * np.abs(Q_POS - K_POS)},
    ),
    "alibi_learnable": (
        {"score_mod": mods.alibi(param="slopes")},
        {"slopes": SLOPES},
        lambda p: {"bias": -p["slopes"][:, None, None] * np.abs(Q_POS - K_POS)[None]},
    ),
    "softcap": (
        {"score_mod": mods.softcap(0.5)},
        {},
        lambda p: {"score": lambda q, k, _: 0.5 * jnp.tanh(scores.scaled_dot(q, k, H**-0.5) / 0.5)},
    ),
    "relative_position_bias": (
        {"score_mod": mods.relative_position_bias(**BUCKETS, param="table")},
        {"table": TABLE},
        lambda p: {"bias": _table_bias(p["table"], bidirectional=True)},
    ),
    "relative_position_bias_causal": (
        {
            "score_mod": mods.relative_position_bias(**BUCKETS, bidirectional=False),
            "mask_mod": mods.causal(),
        },
        {"relative_bias": TABLE},
        lambda p: {"bias": _table_bias(p["relative_bias"], bidirectional=False), "mask": CAUSAL},
    ),
    "causal": ({"mask_mod": mods.causal()}, {}, lambda p: {"is_causal": True}),
    "sliding_window": (
        {"mask_mod": mods.sliding_window(3, 2)},
        {},
        lambda p: {"mask": WINDOW},
    ),
    "dilated": (
        {"mask_mod": mods.dilated(3)},
        {},
        lambda p: {"mask": (Q_POS - K_POS) % 3 == 0},
    ),
    "prefix_lm": (
        {"mask_mod": mods.prefix_lm()},
        {"prefix_lengths": jnp.asarray(PREFIX)},
        lambda p: {"mask": (CAUSAL | (K_POS < PREFIX[:, None, None]))[:, None]},
    ),
    "document": (
        {"mask_mod": mods.document()},
        {"document_ids": jnp.asarray(DOC_IDS)},
        lambda p: {"mask": (DOC_IDS[:, Q_POS[:, 0], None] == DOC_IDS[:, None, :])[:, None]},
    ),
    "and_or_compose": (
        {
            "mask_mod": mods.or_masks(
                mods.and_masks(mods.causal(), mods.sliding_window(3)), mods.dilated(5)
            ),
            "score_mod": mods.compose(mods.alibi(param="slopes"), mods.softcap(2.0)),
        },
        {"slopes": SLOPES},
        lambda p: {
            "mask": (CAUSAL & (K_POS >= Q_POS - 3)) | ((Q_POS - K_POS) % 5 == 0),
            "score": lambda q, k, _: (
                2.0
                * jnp.tanh(
                    (
                        scores.scaled_dot(q, k, H**-0.5)
                        - p["slopes"][None, :, None, None] * np.abs(Q_POS - K_POS)[None, None]
                    )
                    / 2.0
                )
            ),
        },
    ),
}


@functools.cache
def _loss_and_grads(implementation, name, reference):
    """Jitted ``(output, lse, grads wrt q, k, v and the float mod_params)``."""
    mod_kwargs, _, reference_kwargs = CASES[name]

    def loss(q, k, v, floats, data):
        params = {**floats, **data}
        kwargs = reference_kwargs(params) if reference else {**mod_kwargs, "mod_params": params}
        tiles = {"block_sizes": TILES} if implementation != "xla" else {}
        out, lse = aj.attention(
            q,
            k,
            v,
            causal_offset=OFFSET,
            implementation=implementation,
            return_lse=True,
            **tiles,
            **kwargs,
        )
        w_out = jax.random.normal(jax.random.key(7), out.shape)
        finite = jnp.where(jnp.isfinite(lse), lse, 0.0)
        return jnp.sum(out * w_out) + jnp.sum(finite * jnp.cos(finite)), (out, lse)

    def f(q, k, v, floats, data):
        grads, (out, lse) = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
            q, k, v, floats, data
        )
        return out, lse, grads

    return jax.jit(f)


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_mod_matches_dense_reference_forward_and_gradients(name, implementation):
    q, k, v = qkv(3, B, T, S, N, K, H)
    params = CASES[name][1]
    floats = {n: x for n, x in params.items() if jnp.issubdtype(x.dtype, jnp.floating)}
    data = {n: x for n, x in params.items() if n not in floats}
    expected = _loss_and_grads("xla", name, True)(q, k, v, floats, data)
    actual = _loss_and_grads(implementation, name, False)(q, k, v, floats, data)
    assert max_rel_error(actual[:2], expected[:2]) <= FP32_FWD
    assert max_rel_error(actual[2], expected[2]) <= FP32_GRAD
    if floats:  # the learnable parameters do get gradient
        assert all(np.abs(g).max() > 1e-3 for g in jax.tree.leaves(actual[2][3]))


def test_t5_buckets_match_the_scalar_algorithm_over_all_distances():
    relative = np.arange(-40, 41)
    for bidirectional in (True, False):
        expected = [_t5_bucket(int(r), bidirectional=bidirectional, **BUCKETS) for r in relative]
        actual = mods.relative_position_bucket(
            jnp.asarray(relative), bidirectional=bidirectional, **BUCKETS
        )
        np.testing.assert_array_equal(actual, expected)
    assert len(set(expected)) == BUCKETS["num_buckets"]  # every bucket used


def test_alibi_slopes_are_the_papers():
    np.testing.assert_allclose(mods.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_allclose(mods.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: mods.alibi(), "alibi"),
        (lambda: mods.softcap(0.0), "softcap"),
        (lambda: mods.sliding_window(-1), "sliding_window"),
        (lambda: mods.dilated(0), "dilated"),
        (lambda: mods.and_masks(), "at least one"),
    ],
)
def test_bad_gallery_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gallery_mod_lowers_into_the_cuda_kernel(name):
    """``jax.export(..., platforms=["cuda"])`` of a kernel applying the mod: no GPU needed."""
    mod_kwargs, params, _ = CASES[name]
    call = AttentionCall(score=scores.dot, score_params={}, mod_params=params, **mod_kwargs)
    assert lowering_error(call) is None


def test_a_mod_the_kernel_cannot_lower_is_named():
    def sorted_logits(logits, b, h, q_idx, kv_idx, params):
        return jnp.sort(logits, axis=-1)

    call = AttentionCall(score=scores.dot, score_params={}, score_mod=sorted_logits)
    error = lowering_error(call)
    assert "score_mod" in error and "sorted_logits" in error and "sort" in error


def test_scalar_mod_parameters_reach_the_kernel():
    """A 0-d leaf of ``mod_params`` (read as ``params["s"][...]``, a load from a ref inside
    the kernel) gives the dense path's output and gradient on the Pallas path."""

    def scaled(logits, b, h, q_idx, kv_idx, params):
        return logits * params["s"][...] + params["shift"][...]

    q, k, v = qkv(6, B, S, S, N, K, H)
    params = {"s": jnp.float32(0.7), "shift": jnp.int32(3)}

    def loss(s, implementation):
        out = aj.attention(q, k, v, score_mod=scaled, mod_params=params | {"s": s},
                           implementation=implementation)  # fmt: skip
        return jnp.sum(jnp.sin(out))

    dense, pallas = (jax.value_and_grad(loss)(params["s"], i) for i in ("xla", "pallas"))
    assert max_rel_error(pallas, dense) <= FP32_FWD


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_one_token_decoding_equals_the_last_row_of_the_full_call(implementation):
    """Mods see the query's position in key coordinates, so a decoding step (``T = 1``,
    ``causal_offset = S - 1``) gives the last row of the full causal computation."""
    q, k, v = qkv(4, B, S, S, N, K, H)
    kwargs = dict(
        score_mod=mods.compose(mods.relative_position_bias(**BUCKETS), mods.alibi(N)),
        mask_mod=mods.sliding_window(5),
        mod_params={"relative_bias": TABLE},
        implementation=implementation,
    )
    full = aj.attention(q, k, v, **kwargs)
    step = aj.attention(q[:, -1:], k, v, causal_offset=S - 1, **kwargs)
    assert max_rel_error(step, full[:, -1:]) <= FP32_FWD


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_mask_mod_joins_every_other_mask_and_empty_rows_give_zeros(implementation):
    """``mask_mod`` ∧ ``mask`` ∧ lengths ∧ causal: rows left empty give output 0 and zero
    gradients; the rest equals the dense reference with one combined boolean mask."""
    q, k, v = qkv(6, B, T, S, N, K, H)
    every_other = lambda b, h, q_idx, kv_idx, p: (q_idx % 2 == 0) | (kv_idx > 100)  # noqa: E731
    lengths = {"key_value_seq_lengths": jnp.array([21, 9])}
    dense = jnp.asarray(np.random.default_rng(2).random((B, 1, T, S)) < 0.8)
    kwargs = {"is_causal": True, "causal_offset": OFFSET, **lengths}

    def loss(q, k, v, impl, **masks):
        if impl == "pallas":  # the kernels take no dense mask: fold it into the mask mod
            dense_mod = lambda b, h, qi, ki, p: p["dense"][b, 0, qi - OFFSET, ki]  # noqa: E731
            masks = {"mask_mod": mods.and_masks(every_other, dense_mod),
                     "mod_params": {"dense": dense}}  # fmt: skip
        out = aj.attention(q, k, v, implementation=impl, **kwargs, **masks)
        return jnp.sum(out * jnp.cos(out)), out

    grad = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
    (dq, _, _), out = grad(q, k, v, implementation, mask=dense, mask_mod=every_other)
    reference_mask = dense & (Q_POS % 2 == 0)[None, None]
    (dq_ref, _, _), expected = grad(q, k, v, "xla", mask=reference_mask)
    assert max_rel_error(out, expected) <= FP32_FWD
    assert max_rel_error(dq, dq_ref) <= FP32_GRAD
    odd = np.asarray(Q_POS[:, 0] % 2 == 1)
    assert odd.any() and np.all(np.asarray(out)[:, odd] == 0)
    assert np.all(np.asarray(dq)[:, odd] == 0)


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_mod_parameter_gradients_under_vmap(implementation):
    """Examples vmapped over a shared learnable slope vector: its gradient is the sum over
    examples, as on the dense path (each example's own cotangent, not the batch's total)."""
    q, k, v = qkv(7, 3, T, S, N, K, H)  # the leading axis is vmapped, each example unbatched

    def loss(slopes, impl):
        def one(q, k, v):
            return aj.attention(
                q, k, v, score_mod=mods.alibi(param="slopes"), mod_params={"slopes": slopes},
                implementation=impl,
            )  # fmt: skip

        return jnp.sum(jnp.sin(jax.vmap(one)(q, k, v)))

    expected = jax.grad(loss)(SLOPES, "xla")
    assert max_rel_error(jax.grad(loss)(SLOPES, implementation), expected) <= FP32_GRAD
