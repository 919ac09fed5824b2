"""Misused mods and block masks give a clear error or the reference's result, never a
plausible wrong number: stale block masks, mods compared by value, wrong arity, closures
over traced values, parameters inside Pallas, per-batch data for unbatched inputs, integer
inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from attnjax import mods
from attnjax.attention import prepare_call
from attnjax.masks import block_mask
from tests.parity import qkv

TILES = aj.BlockSizes(4, 4)
Q, K, V = qkv(0, 2, 8, 8, 2, 2, 4)
OLD_IDS = jnp.repeat(jnp.arange(2), 4)[None].repeat(2, 0)  # [2, 8]: two documents of 4
NEW_IDS = jnp.repeat(jnp.arange(4), 2)[None].repeat(2, 0)  # four documents of 2


def _document_block(ids):
    return block_mask(mods.document(), {"document_ids": ids}, 2, None, 8, 8, TILES)


def _dense(ids):
    return aj.attention(
        Q, K, V, mask_mod=mods.document(), mod_params={"document_ids": ids}, implementation="xla"
    )


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_a_stale_block_mask_is_an_error(implementation):
    """A block mask of the old documents with the new document ids (the error was 0.63)."""
    with pytest.raises(ValueError, match="stale block mask"):
        aj.attention(
            Q,
            K,
            V,
            mod_params={"document_ids": NEW_IDS},
            block_mask=_document_block(OLD_IDS),
            implementation=implementation,
        )


@pytest.mark.parametrize("implementation", ["chunked", "pallas"])
def test_a_block_mask_brings_its_data_and_traced_data_it_cannot_check_is_an_error(
    implementation,
):
    """Without ``mod_params`` (or without the keys its mask reads) the block mask's own data
    is used; inside ``jit``, other traced ids than the block mask's cannot be compared and
    are an error; a block mask built inside from the same ids is taken."""
    old = _document_block(OLD_IDS)
    alone = aj.attention(Q, K, V, block_mask=old, implementation=implementation)
    np.testing.assert_allclose(alone, _dense(OLD_IDS), atol=1e-5)

    @jax.jit
    def traced(block, params):
        return aj.attention(
            Q, K, V, mod_params=params, block_mask=block, implementation=implementation
        )

    np.testing.assert_allclose(traced(old, {}), _dense(OLD_IDS), atol=1e-5)
    with pytest.raises(ValueError, match=r"mod_params\['document_ids'\] is traced"):
        traced(old, {"document_ids": NEW_IDS})

    @jax.jit
    def built_inside(ids):
        params = {"document_ids": ids}
        block = block_mask(mods.document(), params, 2, None, 8, 8, TILES)
        return aj.attention(
            Q, K, V, mod_params=params, block_mask=block, implementation=implementation
        )

    np.testing.assert_allclose(built_inside(NEW_IDS), _dense(NEW_IDS), atol=1e-5)


def test_a_block_mask_checks_only_the_data_its_mask_reads():
    """Score-mod parameters beside the ids (new values, or passed alone) and the same ids in
    another dtype are not a stale block mask."""
    slopes = jnp.array([0.5, 0.25])
    block = block_mask(
        mods.document(), {"document_ids": OLD_IDS, "slopes": slopes}, 2, None, 8, 8, TILES
    )
    alibi = mods.alibi(param="slopes")
    reference = aj.attention(
        Q, K, V, score_mod=alibi, mask_mod=mods.document(), implementation="xla",
        mod_params={"document_ids": OLD_IDS, "slopes": 2 * slopes},
    )  # fmt: skip
    for params in (
        {"document_ids": OLD_IDS, "slopes": 2 * slopes},
        {"slopes": 2 * slopes},
        {"document_ids": OLD_IDS.astype(jnp.int16), "slopes": 2 * slopes},
    ):
        out = aj.attention(
            Q, K, V, score_mod=alibi, mod_params=params, block_mask=block,
            implementation="chunked",
        )  # fmt: skip
        np.testing.assert_allclose(out, reference, atol=1e-5)


def test_block_masks_compare_mods_by_value():
    """The same gallery mod built twice is the same mod; other arguments are another."""
    block = _document_block(OLD_IDS)
    out = aj.attention(
        Q, K, V, mask_mod=mods.document(), block_mask=block, implementation="chunked"
    )
    np.testing.assert_allclose(out, _dense(OLD_IDS), atol=1e-5)
    window = block_mask(mods.sliding_window(2), None, None, None, 8, 8, TILES)
    aj.attention(Q, K, V, mask_mod=mods.sliding_window(2), block_mask=window)
    with pytest.raises(ValueError, match="differs from the one block_mask was built from"):
        aj.attention(Q, K, V, mask_mod=mods.sliding_window(3), block_mask=window)


def test_mods_of_the_wrong_arity_name_the_expected_signature():
    with pytest.raises(TypeError, match=r"score_mod: expected a function \(logits, b, h, q_idx"):
        aj.attention(Q, K, V, score_mod=lambda logits, b, h, q_idx: logits)
    with pytest.raises(TypeError, match=r"mask_mod: expected a function \(b, h, q_idx, kv_idx"):
        aj.attention(Q, K, V, mask_mod=lambda logits, b, h, q_idx, kv_idx, p: q_idx >= kv_idx)
    with pytest.raises(TypeError, match=r"mask_mod: expected a function"):
        block_mask(lambda b, h: True, None, None, None, 8, 8)


@pytest.mark.parametrize("implementation", ["xla", "chunked", "pallas"])
def test_a_mod_closing_over_a_traced_value_names_mod_params(implementation):
    @jax.jit
    def run(c):
        def shift(logits, b, h, q_idx, kv_idx, params):
            return logits + c

        return aj.attention(Q, K, V, score_mod=shift, implementation=implementation)

    with pytest.raises(ValueError, match=r"closes over a traced value \(c\); pass it as mod_"):
        run(jnp.float32(1.0))


def test_pallas_refuses_a_mod_closing_over_an_array_naming_mod_params():
    table = jnp.arange(8.0)

    def bias(logits, b, h, q_idx, kv_idx, params):
        return logits + table[kv_idx]

    with pytest.raises(ValueError, match=r"closes over an array \(table\); pass it as mod_params"):
        aj.attention(Q, K, V, score_mod=bias, implementation="pallas")
    aj.attention(Q, K, V, score_mod=bias, implementation="chunked")  # constants are fine there


def test_scalar_parameters_behave_as_arrays_inside_pallas():
    """``params["c"] * x`` (no ``[...]``) works in the kernels, with the xla result and
    gradient."""

    def scaled(logits, b, h, q_idx, kv_idx, params):
        return params["c"] * logits

    def loss(c, implementation):
        out = aj.attention(
            Q, K, V, score_mod=scaled, mod_params={"c": c}, implementation=implementation
        )
        return jnp.sum(jnp.sin(out))

    c = jnp.float32(0.7)
    for fn in (loss, jax.grad(loss)):
        np.testing.assert_allclose(fn(c, "pallas"), fn(c, "xla"), rtol=1e-5, atol=1e-6)


def test_a_parameter_table_passed_whole_to_jnp_inside_pallas_says_how_to_read_it():
    def taken(logits, b, h, q_idx, kv_idx, params):
        return logits + jnp.take(params["table"], kv_idx)

    params = {"table": jnp.arange(8.0)}
    np.testing.assert_allclose(
        aj.attention(Q, K, V, score_mod=taken, mod_params=params, implementation="chunked"),
        aj.attention(Q, K, V, score_mod=taken, mod_params=params, implementation="xla"),
        atol=1e-5,
    )
    with pytest.raises(Exception, match=r"is a ref: index it \(params\[name\]\[h\]"):
        aj.attention(Q, K, V, score_mod=taken, mod_params=params, implementation="pallas")


def test_per_batch_data_for_unbatched_inputs_says_it_needs_a_batch_axis():
    with pytest.raises(IndexError, match="per-batch data keeps a batch axis of 1"):
        aj.attention(
            Q[0], K[0], V[0], mask_mod=mods.document(), mod_params={"document_ids": OLD_IDS[0]}
        )
    out = aj.attention(
        Q[0], K[0], V[0], mask_mod=mods.document(), mod_params={"document_ids": OLD_IDS[:1]}
    )
    np.testing.assert_allclose(out, _dense(OLD_IDS)[0], atol=1e-5)


def test_integer_inputs_are_refused():
    """(``prepare_call`` runs attention's checks; in this suite jaxtyping's check of
    ``attention``'s annotations would refuse the integers first.)"""
    ints = jnp.ones((1, 4, 1, 2), jnp.int32)
    with pytest.raises(TypeError, match=r"query: expected a floating-point array, got int32"):
        prepare_call(ints, ints, ints)
