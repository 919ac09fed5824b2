"""The dense XLA implementation: materializes the ``[B, N, T, S]`` logits. The reference path."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from attnjax.masks import MaskSpec, combine
from attnjax.softmax import masked_softmax_with_lse

Score = Callable[[Array, Array, Any], Float[Array, "B N T S"]]


def dense_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    *,
    score: Score,
    score_params: Any,
    score_name: str | None = None,
    bias: Float[Array, "#B #N #T #S"] | None = None,
    mask: Bool[Array, "#B #N #T #S"] | None = None,
    mask_spec: MaskSpec,
    temperature: Float[Array, "..."] | None = None,
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "B N T S"], Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, weights, log-sum-exp)``.

    ``score(q [B, N, T, H], k [B, N, S, H], score_params)`` gives the logits; key/value heads
    are repeated ``N // K`` times for grouped attention. Logits, softmax and the weighted sum
    run in float32; the output is cast to ``query.dtype``. ``score_name`` (the registry name
    of ``score``, if any) is part of the shared interface; kernels use it, this path does not.
    """
    del score_name
    num_heads, num_kv_heads = query.shape[2], key.shape[2]
    group = num_heads // num_kv_heads
    q = jnp.swapaxes(query.astype(jnp.float32), 1, 2)
    k = jnp.swapaxes(jnp.repeat(key.astype(jnp.float32), group, axis=2), 1, 2)
    v = jnp.repeat(value.astype(jnp.float32), group, axis=2)
    logits = score(q, k, score_params).astype(jnp.float32)
    if bias is not None:
        logits = logits + bias
    if temperature is not None:
        logits = logits / temperature
    full_mask = combine(mask, mask_spec.full(query.shape[1], key.shape[1]))
    weights, lse = masked_softmax_with_lse(logits, full_mask)
    output = jnp.einsum("bnts,bsnh->btnh", weights, v)
    return output.astype(query.dtype), weights, lse
