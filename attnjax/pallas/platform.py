"""``implementation="pallas"``: the Pallas kernel of the platform the call is lowered for.

On a GPU backend that is the Triton kernel (:func:`attnjax.pallas.pallas_attention`), on a TPU
backend the Mosaic kernel (:func:`attnjax.pallas.tpu.tpu_attention`). Elsewhere (CPU) the
choice waits for lowering (``jax.lax.platform_dependent``): for CPU the Triton kernels in
Pallas interpret mode (as ``"pallas_triton"``), for CUDA the compiled Triton kernels, for TPU
the Mosaic kernel, so ``jax.export(..., platforms=["tpu"])`` of a ``"pallas"`` call on a CPU
machine holds a ``tpu_custom_call``. Lowering a kernel off its chip needs an abstract device
of that platform (``jax.sharding.use_abstract_mesh``: Mosaic reads the chip generation from
it), so only under one is that kernel traced; ordinary CPU calls trace the interpreter alone.
Nothing is exported in advance to check it: a call a kernel refuses, or a mod that does not
lower into it, raises its ``ValueError`` when (and only when) that kernel is lowered
(:func:`when_lowered`)."""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, Float

from attnjax.call import AttentionCall
from attnjax.pallas.attention import pallas_attention, unsupported
from attnjax.pallas.mods import lowering_error
from attnjax.pallas.tpu import NAME as TPU_NAME
from attnjax.pallas.tpu import tpu_attention


def platform_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
) -> tuple[Float[Array, "B T N Hv"], None, Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, None, log-sum-exp)`` from the Pallas
    kernel of the backend, or of the platform lowered for (CPU: the Triton interpreter)."""
    backend = jax.default_backend()
    if backend == "gpu":
        return pallas_attention(query, key, value, call)
    if backend == "tpu":
        return tpu_attention(query, key, value, call)
    reason = unsupported(call)  # the same refusals whichever kernel is lowered
    if reason is not None:
        raise ValueError(reason)
    shapes = (
        jax.ShapeDtypeStruct((*query.shape[:-1], value.shape[-1]), query.dtype),
        None,
        jax.ShapeDtypeStruct((query.shape[0], query.shape[2], query.shape[1]), jnp.float32),
    )

    traced_for = jax.sharding.get_abstract_mesh().abstract_device

    def kernel(platform, attend):
        def branch():
            if traced_for is None or traced_for.platform != platform:
                message = (
                    f"implementation='pallas' lowered for {platform} on a {backend} backend: "
                    f"its {platform} kernel is traced only under an abstract {platform} device "
                    "(jax.sharding.use_abstract_mesh), which its lowering needs to know the chip"
                )
            else:
                try:
                    return attend(when_lowered(query, lambda: lowering_error(call, platform)))
                except ValueError as error:  # the kernel refuses the call: said where lowered
                    message = str(error)
            zeros = lambda x: when_lowered(jnp.zeros(x.shape, x.dtype), lambda: message)  # noqa: E731
            return jax.tree.map(zeros, shapes)

        return branch

    def mosaic(q):
        shared = dataclasses.replace(call, mod_params=jax.tree.map(_shared, call.mod_params))
        with pltpu.force_tpu_interpret_mode(None):  # the kernel itself, whatever the tests force
            return tpu_attention(q, key, value, shared, interpret=False, check_mods=False)

    return jax.lax.platform_dependent(
        cpu=lambda: pallas_attention(query, key, value, call, interpret=True),
        cuda=kernel("cuda", lambda q: pallas_attention(q, key, value, call, interpret=False)),
        tpu=kernel("tpu", mosaic),
    )


def when_lowered(x: Array, reason: Callable[[], str | None]) -> Array:
    """``x``, unchanged; lowering it raises ``ValueError(reason())`` unless that is ``None``
    (``reason`` runs at lowering, once per lowered use)."""
    return _checked_p.bind(x, reason=reason)


def _shared(x: Array) -> Array:
    """``x``, unchanged; ``vmap`` over it (per-example mod parameters, which the Mosaic kernel
    refuses) gives its first example instead, and an error where that is lowered."""
    return _shared_p.bind(x)


def _batch_shared(args, dims):
    (x,), (dim,) = args, dims
    refusal = (
        f"mod_params: implementation={TPU_NAME!r} (the Mosaic kernel of 'pallas' lowered for "
        "TPU) takes mod parameters shared by the examples of a vmap; use "
        "implementation='chunked' or pass per-example values as a batch axis indexed with b"
    )
    return when_lowered(jnp.take(x, 0, axis=dim), lambda: refusal), None


def _lower_checked(ctx, x, *, reason):
    message = reason()
    if message is not None:
        raise ValueError(message)
    return [x]


_checked_p = Primitive("attnjax_checked_when_lowered")
_checked_p.def_impl(lambda x, *, reason: x)
_checked_p.def_abstract_eval(lambda x, *, reason: x)
ad.defjvp(_checked_p, lambda tangent, x, *, reason: tangent)
batching.defvectorized(_checked_p)
mlir.register_lowering(_checked_p, _lower_checked)

_shared_p = Primitive("attnjax_shared_by_examples")
_shared_p.def_impl(lambda x: x)
_shared_p.def_abstract_eval(lambda x: x)
ad.deflinear2(_shared_p, lambda cotangent, x: [cotangent])
batching.primitive_batchers[_shared_p] = _batch_shared
mlir.register_lowering(_shared_p, lambda ctx, x: [x])
