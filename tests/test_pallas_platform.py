"""``implementation="pallas"``: the Pallas kernel of the platform the call is lowered for.

Exported on this CPU machine for TPU it holds the Mosaic kernel, for CUDA the Triton kernel;
run on CPU it is ``"pallas_triton"`` (the Triton kernels interpreted), bit for bit. A call the
TPU kernel refuses runs on CPU and raises, naming why, only when lowered for TPU. On a CPU
backend another platform's kernel is traced only under an abstract device of that platform
(``jax.sharding.use_abstract_mesh``), which its lowering needs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax as aj
from attnjax import mods
from tests.parity import qkv

TRITON_CALL = "__gpu$xla.gpu.triton"
# Lowering reads the chip: abstract devices stand in for a TPU and a GPU.
DEVICES = {"tpu": "TPU v5 lite", "cuda": "NVIDIA H100"}


def _exported(platform, fn, *args):
    """The StableHLO text of ``jax.export(jit(fn), platforms=[platform])(*args)``."""
    device = jax.sharding.AbstractDevice(
        device_kind=DEVICES[platform], num_cores=1, platform=platform
    )
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=device)
    triton = jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)
    with jax.sharding.use_abstract_mesh(mesh):
        exported = jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=[triton])
        return exported(*args).mlir_module()


def _loss(implementation, **kwargs):
    def loss(q, k, v):
        out, lse = aj.attention(q, k, v, implementation=implementation, return_lse=True, **kwargs)
        return jnp.sum(out.astype(jnp.float32) ** 2) + jnp.sum(jnp.where(lse > -1e30, lse, 0.0))

    return loss


@pytest.mark.parametrize(
    "platform, kernel, other",
    [("tpu", "tpu_custom_call", TRITON_CALL), ("cuda", TRITON_CALL, "tpu_custom_call")],
)
def test_exported_for_a_platform_it_holds_that_platforms_kernel(platform, kernel, other):
    """Forward, dK/dV and dQ: three calls of the platform's kernel, none of the other's (the
    shapes of ``test_pallas_tpu.test_lowers_for_tpu``)."""
    q, k, v = qkv(4, 1, 256, 256, 4, 2, 64)
    grad = jax.grad(_loss("pallas", is_causal=True, causal_offset=5), argnums=(0, 1, 2))
    text = _exported(platform, grad, q, k, v)
    assert text.count(kernel) == 3
    assert other not in text


def test_on_cpu_it_is_pallas_triton_bit_for_bit():
    q, k, v = qkv(1, 2, 40, 72, 4, 2, 16)
    options = {"is_causal": True, "score_mod": mods.alibi(param="slopes")}
    options["mod_params"] = {"slopes": jnp.linspace(0.1, 0.4, 4)}

    def results(implementation):
        loss = _loss(implementation, **options)
        jitted = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)
        return jitted, aj.attention(q, k, v, implementation=implementation, **options)

    jax.tree.map(np.testing.assert_array_equal, results("pallas"), results("pallas_triton"))


def largest_of_a_row(logits, b, h, q_idx, kv_idx, params):
    """Adds the largest entry of head ``h``'s row of a ``[N, L]`` table: the row is a vector
    load from SMEM, which Mosaic does not lower (Triton does)."""
    return logits + jnp.max(params["relative_bias"][h, :], axis=-1)


def test_a_call_the_tpu_kernel_refuses_runs_on_cpu_and_is_refused_when_lowered_for_tpu():
    """float16 inputs, a mod whose parameter read does not lower into Mosaic and per-example
    mod parameters under ``vmap``: each runs here and names why when lowered for TPU; CUDA
    lowers all three."""
    q, k, v = qkv(2, 1, 16, 16, 2, 2, 8)
    table = {"relative_bias": jnp.ones((2, 4))}
    row_read = _loss("pallas", score_mod=largest_of_a_row, mod_params=table)

    def per_example(slopes):
        def attend(s):
            return _loss("pallas", score_mod=mods.alibi(param="slopes"), mod_params={"slopes": s})

        return jnp.sum(jax.vmap(lambda s: attend(s)(q, k, v))(slopes))

    refused = {
        r"query: implementation='pallas_tpu' takes float32 or bfloat16": (
            _loss("pallas"),
            [x.astype(jnp.float16) for x in (q, k, v)],
        ),
        r"score_mod: 'largest_of_a_row.* Mosaic TPU kernel": (row_read, (q, k, v)),
        r"mod_params: .* shared by the examples of a vmap": (per_example, (jnp.ones((3, 2)),)),
    }
    for message, (fn, args) in refused.items():
        grad = jax.grad(fn, argnums=tuple(range(len(args))))
        assert all(np.isfinite(g).all() for g in jax.jit(grad)(*args))
        assert TRITON_CALL in _exported("cuda", grad, *args)
        with pytest.raises(ValueError, match=message):
            _exported("tpu", grad, *args)


def test_lowered_for_tpu_without_an_abstract_tpu_device_it_says_what_is_missing():
    """Mosaic's lowering needs the chip: traced without an abstract TPU device, the Mosaic
    kernel is not traced (saving the CPU calls its cost) and lowering for TPU says so."""
    q, k, v = qkv(2, 1, 16, 16, 2, 2, 8)
    with pytest.raises(ValueError, match=r"only under an abstract tpu device"):
        jax.export.export(jax.jit(_loss("pallas")), platforms=["tpu"])(q, k, v)
