"""The Mosaic GPU flash kernel (:mod:`attnjax.pallas.mosaic_gpu`) off a GPU: its forward and
backward kernels lower for CUDA (``jax.export``), run in Mosaic GPU's interpreter (JAX 0.11+)
with plain dots in place of ``wgmma``, and refuse what they cannot take. The tensor-core path
is checked on a Hopper GPU (tests/test_pallas_gpu.py)."""

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
from attnjax.pallas import mosaic_gpu
from tests.parity import BF16_TOL, max_rel_error, qkv

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


@pytest.mark.skipif(
    not hasattr(mosaic_gpu.plgpu, "InterpretGPUParams"), reason="needs Mosaic GPU's interpreter"
)
@pytest.mark.parametrize(
    "num_q, num_k, heads, kv_heads, head_dim, causal",
    [(200, 333, 4, 2, 64, True), (130, 70, 2, 1, 128, False)],
)
def test_interpreted_kernels_match_the_dense_path(num_q, num_k, heads, kv_heads, head_dim, causal):
    """The kernels' copies, barriers (races raise), schedule, masks and padding in Mosaic GPU's
    interpreter, plain dots standing in for wgmma: output, log-sum-exp and the gradients of
    both against the dense path in float32."""
    q, k, v = qkv(3, 2, num_q, num_k, heads, kv_heads, head_dim, jnp.bfloat16)
    q = (q * head_dim**-0.5).astype(q.dtype)
    d_out = jax.random.normal(jax.random.key(4), q.shape, jnp.bfloat16)
    d_lse = jax.random.normal(jax.random.key(5), (2, heads, num_q))

    def dense(q, k, v):
        return aj.attention(q, k, v, scale=1.0, is_causal=causal, return_lse=True,
                            implementation="xla")  # fmt: skip

    kernel = lambda q, k, v: mosaic_gpu.flash(q, k, v, causal, interpret=True)  # noqa: E731
    actual, vjp = jax.vjp(kernel, q, k, v)
    expected, vjp_dense = jax.vjp(dense, *(x.astype(jnp.float32) for x in (q, k, v)))
    assert max_rel_error(actual, expected) <= BF16_TOL
    grads = vjp((d_out, d_lse))
    assert max_rel_error(grads, vjp_dense((d_out.astype(jnp.float32), d_lse))) <= BF16_TOL
