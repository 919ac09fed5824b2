"""``attnjax.sharded.ring_attention`` (``strategy="all_gather"``) on 4 CPU devices against
``attnjax.attention`` on one, forward and gradients (in a subprocess: the device count is fixed
when JAX starts)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import attnjax as aj
from attnjax.sharded import ring_attention

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT = """
import json, jax, jax.numpy as jnp, numpy as np
import attnjax as aj
from attnjax import mods, scores
from attnjax.sharded import ring_attention
from tests.parity import max_rel_error, qkv
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seq",))
B, T, N, K, H, A = 2, 24, 4, 2, 8, 6  # 6 queries per shard: not a multiple of any tile
q, k, v = qkv(0, B, T, T, N, K, H)
ks = jax.random.split(jax.random.key(1), 4)
additive = {"w_q": jax.random.normal(ks[0], (N, H, A)) / 3,
            "w_k": jax.random.normal(ks[1], (H, A)) / 3, "v": jax.random.normal(ks[2], (A,))}
segments = jnp.repeat(jnp.arange(3), jnp.array([5, 11, 8]))[None].repeat(B, 0)
CASES = {
    "scaled_dot_causal_offset": ({"is_causal": True, "causal_offset": 3}, {}),
    "additive_params": ({"score": "additive", "is_causal": True}, {"score_params": additive}),
    "callable_score": ({"score": lambda q, k, p: scores.dot(q, k) * p["s"]},
                       {"score_params": {"s": jnp.float32(0.3)}}),
    "segment_ids": ({"q_segment_ids": segments, "kv_segment_ids": segments}, {}),
    "sliding_window_mod": ({"mask_mod": mods.sliding_window(5, 2)}, {}),
    "relative_bias": ({"score_mod": mods.relative_position_bias(8, 16), "is_causal": True},
                      {"mod_params": {"relative_bias": jax.random.normal(ks[3], (N, 8))}}),
}
errors = {}
for name, (fixed, diff) in CASES.items():
    def loss(fn, q, k, v, diff):
        out = fn(q, k, v, **fixed, **diff)
        return jnp.sum(out * jnp.cos(out)), out
    ring = lambda q, k, v, **a: ring_attention(q, k, v, mesh=mesh, axis="seq", **a)
    reference = lambda q, k, v, **a: aj.attention(q, k, v, implementation="xla", **a)
    grad = lambda fn: jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2, 3), has_aux=True)
    g_ring, out_ring = jax.jit(grad(ring))(q, k, v, diff)
    g_ref, out_ref = grad(reference)(q, k, v, diff)
    errors[name] = [max_rel_error(out_ring, out_ref), max_rel_error(g_ring, g_ref)]
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def errors():
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "case",
    ["scaled_dot_causal_offset", "additive_params", "callable_score", "segment_ids",
     "sliding_window_mod", "relative_bias"],
)  # fmt: skip
def test_all_gather_matches_one_device(errors, case):
    forward, gradients = errors[case]
    assert forward <= 1e-5 and gradients <= 1e-4, (forward, gradients)


def test_clear_errors_for_bad_shards_and_axes():
    mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="axis: 'ring'"):
        ring_attention(q, q, q, mesh=mesh, axis="ring")
    with pytest.raises(ValueError, match="strategy"):
        ring_attention(q, q, q, mesh=mesh, axis="seq", strategy="ring")
    with pytest.raises(ValueError, match="bias: not taken"):
        ring_attention(q, q, q, mesh=mesh, axis="seq", bias=np.zeros((4, 4)))
    out = ring_attention(q, q, q, mesh=mesh, axis="seq", is_causal=True)
    np.testing.assert_allclose(out, aj.attention(q, q, q, is_causal=True), atol=1e-6)
