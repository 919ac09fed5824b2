"""The dense XLA implementation: materializes the ``[B, N, T, S]`` logits. The reference path."""

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, Float

from attnjax.call import AttentionCall
from attnjax.softmax import masked_softmax_with_lse


def dense_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
    hook: Callable[[str, Array], Array] | None = None,
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "B N T S"], Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, weights, log-sum-exp)``.

    Key/value heads are repeated ``N // K`` times for grouped attention. Logits, softmax and
    the weighted sum run in float32; the output is cast to ``query.dtype``. A block mask only
    saves work on tiled paths: here its ``mask_mod`` is evaluated everywhere. ``hook(name,
    x)`` (:mod:`attnjax.nn.hooks`) may read or replace the ``"logits"`` (masked keys
    ``-inf``; the mask applies again after it) and the ``"pattern"`` (the weights).
    """
    batch, num_queries, num_heads, _ = query.shape
    num_keys = key.shape[1]
    group = num_heads // key.shape[2]
    q = jnp.swapaxes(query, 1, 2)
    k = jnp.swapaxes(jnp.repeat(key, group, axis=2), 1, 2)
    v = jnp.repeat(value.astype(jnp.float32), group, axis=2)
    q_idx, k_idx = jnp.arange(num_queries), jnp.arange(num_keys)
    logits = call.logits(
        q, k, q_idx, k_idx, call.score_params, call.bias, call.temperature, call.mod_params
    )
    mask = call.element_mask((batch, num_heads), q_idx, k_idx, call.mask, call.mod_params)
    if hook is not None:
        logits = hook("logits", logits if mask is None else jnp.where(mask, logits, -jnp.inf))
    weights, lse = masked_softmax_with_lse(logits, mask)
    if hook is not None:
        weights = hook("pattern", weights)
    output = jnp.einsum("bnts,bsnh->btnh", weights, v)
    return output.astype(query.dtype), weights, lse
