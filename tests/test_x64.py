"""Every path with float32 inputs under ``jax_enable_x64``, against ``jax.nn``.

x64 is a process-wide flag, so the checks run in a subprocess (``JAX_ENABLE_X64=1``) and this
test only reads its outcome. Under x64 integers default to int64: lengths, offsets and loop
indices mix with the int32 positions the implementations use. Run this file directly to see
the checks' output.
"""

import functools
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

import attnjax as aj
from attnjax import mods
from attnjax import nn as ann
from attnjax.masks import block_mask
from attnjax.sharded import ring_attention

B, T, N, K, H = 2, 8, 4, 2, 8
BLOCKS = aj.BlockSizes(4, 4)
PALLAS_BLOCKS = aj.BlockSizes(8, 8)


def test_every_path_works_under_x64_with_float32_inputs():
    from tests.cpu import subprocess_env  # here: the file also runs as a script

    root = pathlib.Path(__file__).parents[1]
    env = subprocess_env(JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, __file__], env=env, cwd=root, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all x64 checks passed" in run.stdout


def _inputs():
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (B, T, N, H), jnp.float32)
    k = jax.random.normal(keys[1], (B, T, K, H), jnp.float32)
    v = jax.random.normal(keys[2], (B, T, K, H), jnp.float32)
    mask = jax.random.bernoulli(keys[3], 0.7, (B, 1, T, T)).at[..., 0].set(True)
    cotangent = jax.random.normal(keys[4], (B, T, N, H), jnp.float32)
    return q, k, v, mask, cotangent


def _check_against_jax_nn(implementation, block_sizes):
    """Forward, residual and gradients with a mask (a window on Pallas, which takes no dense
    mask), lengths (int64 here: x64's default) and causality, against ``jax.nn`` (int32
    lengths, as it requires)."""
    q, k, v, mask, cotangent = _inputs()
    lengths = {"query_seq_lengths": [T, 5], "key_value_seq_lengths": [6, T]}
    common = {"is_causal": True}
    common |= {"local_window_size": (3, 0)} if implementation == "pallas" else {"mask": mask}
    ours = functools.partial(
        aj.attention,
        implementation=implementation,
        block_sizes=block_sizes,
        **{n: jnp.array(x) for n, x in lengths.items()},
        **common,
    )
    ref = functools.partial(
        jax.nn.dot_product_attention,
        **{n: jnp.array(x, jnp.int32) for n, x in lengths.items()},
        **common,
    )
    assert ours(q, k, v).dtype == jnp.float32
    (out, lse), vjp = jax.vjp(functools.partial(ours, return_residual=True), q, k, v)
    (want, want_lse), want_vjp = jax.vjp(functools.partial(ref, return_residual=True), q, k, v)
    np.testing.assert_allclose(out, want, atol=1e-5)
    valid = (np.arange(T)[None, :] < np.array([T, 5])[:, None])[..., None]
    np.testing.assert_allclose(np.where(valid, lse, 0), np.where(valid, want_lse, 0), atol=1e-5)
    for got, expected in zip(vjp((cotangent, lse)), want_vjp((cotangent, lse)), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def _check_block_mask(implementation, block_sizes):
    """A ``mask_mod`` through a block mask (int64 document ids) equals the dense path."""
    q, k, v, _, _ = _inputs()
    params = {"document_ids": jnp.repeat(jnp.arange(4), 2)[None].repeat(B, 0)}
    block = block_mask(mods.document(), params, B, None, T, T, block_sizes)
    expected = aj.attention(
        q, k, v, mask_mod=mods.document(), mod_params=params, implementation="xla"
    )

    def run(q):
        return aj.attention(
            q, k, v, block_mask=block, mod_params=params, implementation=implementation
        )

    np.testing.assert_allclose(run(q), expected, atol=1e-5)
    assert np.isfinite(jax.grad(lambda q: run(q).sum())(q)).all()


def _check_decoding():
    """One token at a time from the cache equals Flax's module with the same weights."""
    kw = {"num_kv_heads": 2, "decode": True}
    flax_module = nnx.MultiHeadAttention(4, 16, 24, rngs=nnx.Rngs(1), **kw)
    ours = ann.MultiHeadAttention(4, 16, 24, rngs=nnx.Rngs(1), **kw)
    nnx.update(ours, nnx.state(flax_module, nnx.Param))
    x = jax.random.normal(jax.random.key(3), (2, 4, 16), jnp.float32)
    for module in (flax_module, ours):
        module.init_cache(x.shape)
    for t in range(x.shape[1]):
        step = ours(x[:, t : t + 1])
        assert step.dtype == jnp.float32
        np.testing.assert_allclose(step, flax_module(x[:, t : t + 1]), atol=1e-5)


def _check_sharded():
    """The ring on a one-device mesh equals ``attention``."""
    q, k, v, _, _ = _inputs()
    mesh = Mesh(np.array(jax.devices()[:1]), ("seq",))
    out = ring_attention(q, k, v, mesh=mesh, axis="seq", is_causal=True, causal_offset=1)
    np.testing.assert_allclose(
        out, aj.attention(q, k, v, is_causal=True, causal_offset=1), atol=1e-5
    )


def main():
    assert jax.config.jax_enable_x64, "run with JAX_ENABLE_X64=1"
    with jax.numpy_rank_promotion("raise"):
        for implementation, blocks in (
            ("xla", None),
            ("chunked", BLOCKS),
            ("pallas", PALLAS_BLOCKS),
        ):
            _check_against_jax_nn(implementation, blocks)
            print(implementation, "matches jax.nn")
        for implementation, blocks in (("chunked", BLOCKS), ("pallas", PALLAS_BLOCKS)):
            _check_block_mask(implementation, blocks)
            print(implementation, "block mask matches xla")
        _check_decoding()
        print("decoding matches flax")
        _check_sharded()
        print("ring attention matches attention")
    print("all x64 checks passed")


if __name__ == "__main__":
    main()
