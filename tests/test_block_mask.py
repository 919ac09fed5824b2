"""Tile kinds (``MaskSpec.classify``, ``masks.block_mask``) against brute force, and the tiled
path's use of them: empty tiles are never read, ``mask_mod`` runs on partial tiles only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from attnjax import masks, mods
from attnjax.masks import EMPTY, FULL, PARTIAL, MaskSpec
from tests.parity import FP32_FWD, max_rel_error, qkv

B, T, S, N, K, H = 2, 13, 21, 4, 2, 8
TILES = aj.BlockSizes(4, 8)


def _brute_kinds(visible: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """Kinds of a ``[..., T, S]`` boolean array's tiles (partial last tiles included)."""
    t, s = visible.shape[-2:]
    out = np.zeros((*visible.shape[:-2], -(-t // bq), -(-s // bk)), np.int8)
    for i in range(out.shape[-2]):
        for j in range(out.shape[-1]):
            tile = visible[..., i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
            out[..., i, j] = np.where(
                tile.all((-2, -1)), FULL, np.where(tile.any((-2, -1)), PARTIAL, EMPTY)
            )
    return out


def _dense(mask_mod, params, batch, heads, offset=0):
    idx = masks.mod_indices(batch, heads, np.arange(T), np.arange(S), offset)
    return np.broadcast_to(np.asarray(mask_mod(*idx, params)), (batch, heads, T, S))


@pytest.mark.parametrize("bq, bk", [(4, 8), (5, 3), (13, 21)])
def test_block_mask_kinds_match_brute_force(bq, bk):
    params = {"document_ids": jnp.asarray(np.repeat([[0, 1, 2], [3, 3, 4]], [5, 9, 7], axis=1))}
    mask_mod = mods.or_masks(mods.document(), mods.sliding_window(2, 0))
    block = masks.block_mask(
        mask_mod, params, B, None, T, S, aj.BlockSizes(bq, bk), causal_offset=4
    )
    expected = _brute_kinds(_dense(mask_mod, params, B, 1, offset=4), bq, bk)
    np.testing.assert_array_equal(block.kinds, expected)
    assert {EMPTY, PARTIAL} <= set(np.unique(expected)) or (bq, bk) == (13, 21)
    assert "density" in repr(block) and block.density() == pytest.approx(np.mean(expected != EMPTY))


def test_block_mask_is_jittable_with_per_batch_data():
    build = jax.jit(
        lambda ids: masks.block_mask(mods.document(), {"document_ids": ids}, B, None, T, S, TILES)
    )
    ids = jnp.asarray(np.repeat([[0, 1], [0, 0]], [10, 11], axis=1))
    np.testing.assert_array_equal(
        build(ids).kinds, _brute_kinds(_dense(mods.document(), {"document_ids": ids}, B, 1), 4, 8)
    )


def test_structured_classification_is_exact_or_conservative():
    """Causal, window, lengths: exact. Segment ids: never EMPTY when some pair is visible,
    never FULL when some pair is not."""
    rng = np.random.default_rng(1)
    segments = {
        "q_segment_ids": jnp.asarray(np.sort(rng.integers(0, 3, (B, T)), axis=1)),
        "kv_segment_ids": jnp.asarray(np.sort(rng.integers(0, 3, (B, S)), axis=1)),
    }
    lengths = {"q_lengths": jnp.array([13, 6]), "kv_lengths": jnp.array([4, 21])}
    for spec, exact in [
        (MaskSpec(is_causal=True, offset=jnp.asarray(5)), True),
        (MaskSpec(window=(3, 1), offset=jnp.asarray(-2)), True),
        (MaskSpec(is_causal=True, **lengths), True),
        (MaskSpec(**segments), False),
    ]:
        for bq, bk in [(4, 8), (3, 5)]:
            kinds = np.asarray(spec.classify(T, S, aj.BlockSizes(bq, bk)))
            visible = np.broadcast_to(np.asarray(spec.full(T, S)), (B, 1, T, S))
            expected = _brute_kinds(visible, bq, bk)
            kinds = np.broadcast_to(kinds, expected.shape)
            if exact:
                np.testing.assert_array_equal(kinds, expected)
            else:
                assert np.all((kinds == EMPTY) <= (expected == EMPTY))
                assert np.all((kinds == FULL) <= (expected == FULL))
                assert np.mean(kinds == expected) > 0.5


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_empty_tiles_are_never_read(implementation):
    """Keys 8..15 are hidden from every query and their values are NaN: a tiled path that read
    their tiles would return NaN (0 · NaN); the dense path has to and does."""
    hide = lambda b, h, q, kv, p: (kv < 8) | (kv >= 16)  # noqa: E731
    q, k, v = qkv(0, B, T, S, N, K, H)
    v = v.at[:, 8:16].set(jnp.nan)
    block = masks.block_mask(hide, None, None, None, T, S, TILES)
    assert np.all(np.asarray(block.kinds)[..., 1] == EMPTY)
    out = aj.attention(q, k, v, block_mask=block, implementation=implementation)
    assert np.all(np.isfinite(out))
    expected = aj.attention(q, k, v.at[:, 8:16].set(0.0), mask_mod=hide, implementation="xla")
    assert max_rel_error(out, expected) <= FP32_FWD
    assert np.all(np.isnan(aj.attention(q, k, v, mask_mod=hide, implementation="xla")))


def test_mask_mod_runs_on_partial_tiles_only():
    calls = []

    def counted(b, h, q_idx, kv_idx, params):
        jax.debug.callback(lambda: calls.append(1))
        return mods.causal()(b, h, q_idx, kv_idx, params)

    block = masks.block_mask(counted, None, None, None, T, S, TILES)
    kinds = np.asarray(block.kinds)
    calls.clear()
    q, k, v = qkv(0, B, T, S, N, K, H)
    jax.block_until_ready(aj.attention(q, k, v, block_mask=block, implementation="chunked"))
    assert len(calls) == np.sum(kinds == PARTIAL) > 0
    assert np.sum(kinds == FULL) > 0  # some tiles were full and skipped the mod


def test_block_mask_errors_name_the_argument():
    q, k, v = qkv(0, B, T, S, N, K, H)
    block = masks.block_mask(mods.causal(), None, None, None, T, S, TILES)
    with pytest.raises(ValueError, match="block_sizes"):
        aj.attention(q, k, v, block_mask=block, block_sizes=aj.BlockSizes(8, 8))
    with pytest.raises(ValueError, match="mask_mod"):  # mods.causal() again is the same mod
        aj.attention(q, k, v, block_mask=block, mask_mod=mods.sliding_window(3))
    with pytest.raises(ValueError, match="block_mask"):
        aj.attention(q[:, :5], k, v, block_mask=block)
    for implementation in ("xla", "chunked"):
        with pytest.raises(TypeError, match="mask_mod: must return booleans"):
            aj.attention(
                q, k, v, mask_mod=lambda b, h, qi, ki, p: qi - ki, implementation=implementation
            )
    with pytest.raises(ValueError, match="score_mod"):
        aj.attention(q, k, v, score_mod=lambda s, b, h, qi, ki, p: s[..., :1])


def test_block_mask_plot_draws_each_tile():
    block = masks.block_mask(mods.causal(), None, None, None, T, S, TILES)
    ax = block.plot()
    assert ax.images[0].get_array().shape == block.kinds.shape[2:]


def test_a_block_mask_for_another_offset_stays_correct_under_jit():
    """Built for ``causal_offset=0`` and used at a traced offset 8: the tiles all count as
    partial, so nothing is skipped wrongly."""
    q, k, v = qkv(1, B, T, S, N, K, H)
    window = mods.sliding_window(2)
    block = masks.block_mask(window, None, None, None, T, S, TILES)

    def call(offset, implementation, **kwargs):
        return aj.attention(
            q, k, v, causal_offset=offset, implementation=implementation, **kwargs
        )  # fmt: skip

    expected = call(8, "xla", mask_mod=window)
    for implementation in ("chunked", "pallas"):
        out = jax.jit(call, static_argnums=1)(8, implementation, block_mask=block)
        assert max_rel_error(out, expected) <= FP32_FWD
