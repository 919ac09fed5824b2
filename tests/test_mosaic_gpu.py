"""The Mosaic GPU flash kernel (:mod:`attnjax.pallas.mosaic_gpu`) off a GPU: its forward and
backward kernels lower for CUDA (``jax.export``) and it refuses what it cannot take. Its
numerics are checked on a Hopper GPU (tests/test_pallas_gpu.py): Mosaic GPU has no CPU
interpreter for ``wgmma``."""

import jax
import jax.numpy as jnp
import pytest

from attnjax.pallas import mosaic_gpu

pytestmark = pytest.mark.skipif(mosaic_gpu.plgpu is None, reason="needs JAX's Mosaic GPU")


def _shapes(num_q, num_k, heads, kv_heads, head_dim, dtype=jnp.bfloat16):
    kv = jax.ShapeDtypeStruct((2, num_k, kv_heads, head_dim), dtype)
    return jax.ShapeDtypeStruct((2, num_q, heads, head_dim), dtype), kv, kv


@pytest.mark.parametrize("causal, head_dim", [(True, 64), (False, 128)])
def test_forward_and_backward_lower_for_cuda(causal, head_dim):
    """GQA, lengths that are no multiple of a tile: the forward and both backward kernels."""

    def loss(q, k, v):
        out, lse = mosaic_gpu.flash(q, k, v, causal)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    exported = jax.export.export(grad, platforms=["cuda"])(*_shapes(200, 333, 4, 2, head_dim))
    assert exported.mlir_module().count("mosaic_gpu_v2(") == 3


@pytest.mark.parametrize(
    "shapes, needs",
    [
        (_shapes(64, 64, 2, 2, 64, jnp.float32), "bfloat16 or float16"),
        (_shapes(64, 64, 2, 2, 96), "a head dim of 64 or 128"),
        (_shapes(64, 64, 3, 2, 64), "N a multiple of K"),
    ],
)
def test_refuses_what_it_cannot_take(shapes, needs):
    with pytest.raises(ValueError, match=r"mosaic_gpu\.flash needs") as error:
        jax.eval_shape(lambda q, k, v: mosaic_gpu.flash(q, k, v, False), *shapes)
    assert needs in str(error.value)
