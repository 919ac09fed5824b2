"""Sequence-parallel attention on 4 and 8 CPU devices against one device, both strategies:
the six cases of the issue on both; on 4 devices also lengths with a per-head temperature, a
document mod with a window, cross attention with a contiguous causal layout, Pallas forward
blocks (plain and with a learnable relative bias), bias arrays (per query row and per key,
with gradients) with a dense mask, use inside one's own shard_map, the zigzag layout, and
errors that need several devices."""

import pytest

from tests.sharded.parity import errors as run

CORE = ["scaled_dot_causal_offset", "additive_params", "callable_score", "segment_ids",
        "sliding_window_mod", "relative_bias"]  # fmt: skip
EXTENDED = ["lengths_temperature", "document_mod_window", "cross_contiguous_causal",
            "pallas_blocks", "pallas_relative_bias", "bias_rows_and_mask",
            "bias_columns"]  # fmt: skip
STRATEGIES = ["ring", "all_gather"]


@pytest.fixture(scope="module")
def errors():
    """On 4 devices, every case."""
    return run(4, extended=True)


@pytest.fixture(scope="module")
def errors_8():
    """On 8 devices, the six cases of the issue."""
    return run(8, extended=False)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CORE + EXTENDED)
def test_4_devices_match_one(errors, strategy, case):
    forward, gradients = errors[f"{strategy}/{case}"]
    assert forward <= 1e-5 and gradients <= 1e-4, (forward, gradients)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CORE)
def test_8_devices_match_one(errors_8, strategy, case):
    forward, gradients = errors_8[f"{strategy}/{case}"]
    assert forward <= 1e-5 and gradients <= 1e-4, (forward, gradients)


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_inside_a_shard_map_of_ones_own(errors, strategy):
    forward, gradients = errors[f"{strategy}/inside_shard_map"]
    assert forward <= 1e-5 and gradients <= 1e-4, (forward, gradients)


def test_arrays_on_other_devices_than_the_mesh_are_refused(errors):
    assert "sharded over other devices" in errors["errors/mesh_mismatch"]


def test_a_length_not_a_multiple_of_the_chunks_is_refused(errors):
    assert "sequence length 20 is not a multiple of 8" in errors["errors/length"]


def test_zigzag_deals_chunks_d_and_2p_minus_1_minus_d(errors):
    dealt, back = errors["layout/zigzag"]
    # 8 chunks of 2 positions; device d holds chunks d and 7 - d.
    assert dealt == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert back == list(range(16))


def test_on_gpu_a_bias_keeps_the_blocks_on_the_chunked_path(errors):
    assert errors["gpu_choice_with_bias"] <= 1e-5


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", ["nan_query", "inf_key"])
def test_nan_and_inf_give_jax_nn_rows_across_devices(errors, strategy, case):
    """A NaN in a query or an ``inf`` in a key: the NaN rows of ``jax.nn``, its values
    elsewhere, NaN in the gradients."""
    same_rows, error, nan_gradients = errors[f"nonfinite/{strategy}/{case}"]
    assert same_rows and error <= 1e-5 and nan_gradients, (same_rows, error, nan_gradients)
