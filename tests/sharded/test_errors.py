"""Clear errors of sequence-parallel attention, and its one-device behaviour."""

import jax
import jaxtyping
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

import attnjax as aj
from attnjax.sharded import ring_attention, ring_attention_shard

MESH = Mesh(np.array(jax.devices()[:1]), ("seq",))
Q = np.random.default_rng(0).normal(size=(1, 4, 2, 8)).astype(np.float32)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"axis": "ring"}, "axis: 'ring' is not an axis"),
        ({"strategy": "ulysses"}, "strategy: expected one of"),
        ({"layout": "striped"}, "layout: expected one of"),
        ({"bias": np.zeros((3, 4))}, r"bias: shape \(1, 1, 3, 4\) on this device"),
        ({"block_mask": object()}, "block_mask: not taken"),
        ({"temperature": np.ones((1, 1, 4, 1))}, "temperature: shape .* varies along T"),
        ({"implementation": "xla"}, "implementation: expected one of"),
    ],
)
def test_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ring_attention(Q, Q, Q, mesh=MESH, **{"axis": "seq", **kwargs})


def test_unbatched_inputs_are_refused():
    """Our error, or jaxtyping's naming ``query`` under the runtime checks."""
    with pytest.raises((ValueError, jaxtyping.TypeCheckError), match=r"\[B, T, N, H\]|'query'"):
        ring_attention(Q[0], Q[0], Q[0], mesh=MESH, axis="seq")


def test_check_vma_is_refused_inside_shard_map():
    local = jax.shard_map(
        lambda q: ring_attention_shard(q, q, q, axis_name="seq"),
        mesh=MESH, in_specs=PartitionSpec(None, "seq"), out_specs=PartitionSpec(None, "seq"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="check_vma=False"):
        local(Q)


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_one_device_equals_attention(strategy):
    out, lse = ring_attention(Q, Q, Q, mesh=MESH, axis="seq", strategy=strategy,
                              is_causal=True, return_lse=True)  # fmt: skip
    ref, ref_lse = aj.attention(Q, Q, Q, is_causal=True, return_lse=True)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-6)
