"""Sequence-parallel attention on 8 CPU devices against one device, both strategies."""

import pytest

from tests.sharded.parity import errors as run

CASES = ["scaled_dot_causal_offset", "additive_params", "callable_score", "segment_ids",
         "sliding_window_mod", "relative_bias"]  # fmt: skip


@pytest.fixture(scope="module")
def errors():
    return run(8, extended=False)


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
@pytest.mark.parametrize("case", CASES)
def test_matches_one_device(errors, strategy, case):
    forward, gradients = errors[f"{strategy}/{case}"]
    assert forward <= 1e-5 and gradients <= 1e-4, (forward, gradients)
