"""The chunked XLA implementation: an online softmax over tiles, O(T) memory forward and backward.

The forward pass visits each query block's key blocks with a running maximum, running sum and
rescaled accumulator (FlashAttention); tiles the causal/window rules mask entirely are skipped.
A ``jax.custom_vjp`` recomputes each tile's logits in the backward pass (FlashAttention-2), so
nothing of size ``[T, S]`` is ever stored. The logits of a tile come from the same ``score``
callable the dense path uses, differentiated with ``jax.vjp``: every score works, with
gradients for ``score_params``, ``bias`` and ``temperature``.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from attnjax.dense import Score
from attnjax.masks import MaskSpec, combine
from attnjax.tiling import (
    BlockSizes,
    as_4d,
    key_block_range,
    online_finish,
    online_init,
    online_step,
    pad_axis,
    pad_tiles,
    query_block_range,
    recomputed_probs,
    round_up,
    tile,
    tile_add,
)

DEFAULT_BLOCKS = BlockSizes(block_q=1024, block_k=128)
# Additive scores hold a [B, N, block_q, block_k, A] hidden tile: keep it small.
DEFAULT_ADDITIVE_BLOCKS = BlockSizes(block_q=128, block_k=128)


def chunked_attention(
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
    block_sizes: BlockSizes | None = None,
) -> tuple[Float[Array, "B T N Hv"], None, Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, None, log-sum-exp)``.

    Same arguments and results as :func:`attnjax.dense.dense_attention`, except that the
    ``[B, N, T, S]`` weights are never formed (``None`` is returned in their place).
    ``block_sizes`` defaults to ``DEFAULT_ADDITIVE_BLOCKS`` for additive scores and
    ``DEFAULT_BLOCKS`` otherwise; lengths that are not multiples of it are padded inside.
    """
    if block_sizes is None:
        additive = score_name is not None and score_name.startswith("additive")
        block_sizes = DEFAULT_ADDITIVE_BLOCKS if additive else DEFAULT_BLOCKS
    num_queries, num_keys = query.shape[1], key.shape[1]
    config = _Config(
        score=score,
        blocks=block_sizes.clamp(num_queries, num_keys),
        num_queries=num_queries,
        num_keys=num_keys,
    )
    tq, ts = round_up(num_queries, config.blocks.block_q), round_up(num_keys, config.blocks.block_k)
    q = pad_axis(jnp.swapaxes(query, 1, 2), 2, tq)
    k = pad_axis(jnp.swapaxes(key, 1, 2), 2, ts)
    v = pad_axis(jnp.swapaxes(value, 1, 2), 2, ts)
    params = jax.tree.map(jnp.asarray, score_params)
    bias, temperature = (pad_tiles(as_4d(x), tq, ts, 1) for x in (bias, temperature))
    mask = pad_tiles(as_4d(mask), tq, ts, False)
    out, lse = _attention(config, q, k, v, params, bias, temperature, mask, mask_spec)
    out = jnp.swapaxes(out[:, :, :num_queries], 1, 2).astype(query.dtype)
    return out, None, lse[:, :, :num_queries]


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static part of one call: the score, the clamped blocks, the unpadded lengths."""

    score: Score
    blocks: BlockSizes
    num_queries: int
    num_keys: int


def _tile_logits(config, q, k, params, bias, temperature):
    """Logits ``[B, N, bq, bk]`` of one tile: ``(score + bias) / temperature`` in float32."""
    group = q.shape[1] // k.shape[1]
    k = jnp.repeat(k.astype(jnp.float32), group, axis=1)
    logits = config.score(q.astype(jnp.float32), k, params).astype(jnp.float32)
    if bias is not None:
        logits = logits + bias
    if temperature is not None:
        logits = logits / temperature
    return logits


def _tile_mask(config, mask, mask_spec, q_start, k_start):
    """The tile's mask: the rules, the dense mask, and the padded keys; ``None`` if all valid."""
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_idx, k_idx = q_start + jnp.arange(bq), k_start + jnp.arange(bk)
    padded = config.num_keys % bk != 0
    return combine(
        mask_spec.block(q_idx, k_idx),
        tile(mask, q_start, k_start, bq, bk),
        (k_idx < config.num_keys)[None, None, None, :] if padded else None,
    )


def _group(x: Array, num_kv_heads: int) -> Array:
    """``[B, N, ...] -> [B, K, N // K, ...]``."""
    return x.reshape(x.shape[0], num_kv_heads, -1, *x.shape[2:])


def _forward(config, q, k, v, params, bias, temperature, mask, mask_spec):
    bq, bk = config.blocks.block_q, config.blocks.block_k
    batch, heads, tq, _ = q.shape
    num_kv, ts, hv = k.shape[1], k.shape[2], v.shape[3]

    def query_block(i):
        q_start = i * bq
        q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, bq, axis=2)

        def body(j, carry):
            k_start = j * bk
            k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, bk, axis=2)
            v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, bk, axis=2).astype(jnp.float32)
            s = _tile_logits(
                config,
                q_blk,
                k_blk,
                params,
                tile(bias, q_start, k_start, bq, bk),
                tile(temperature, q_start, k_start, bq, bk),
            )

            def weighted_sum(p):
                pv = jnp.einsum("bkgts,bksh->bkgth", _group(p, num_kv), v_blk)
                return pv.reshape(batch, heads, bq, hv)

            tile_mask = _tile_mask(config, mask, mask_spec, q_start, k_start)
            return online_step(carry, s, tile_mask, weighted_sum)

        lo, hi = key_block_range(mask_spec, q_start, bq, bk, ts // bk)
        carry = jax.lax.fori_loop(lo, hi, body, online_init((batch, heads, bq), hv))
        return online_finish(carry)

    out, lse = jax.lax.map(query_block, jnp.arange(tq // bq))
    out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, tq, hv)
    return out, jnp.moveaxis(lse, 0, 2).reshape(batch, heads, tq)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, params, bias, temperature, mask, mask_spec):
    return _forward(config, q, k, v, params, bias, temperature, mask, mask_spec)


def _attention_fwd(config, q, k, v, params, bias, temperature, mask, mask_spec):
    out, lse = _forward(config, q, k, v, params, bias, temperature, mask, mask_spec)
    return (out, lse), (q, k, v, params, bias, temperature, mask, mask_spec, out, lse)


def _attention_bwd(config, residuals, cotangents):
    q, k, v, params, bias, temperature, mask, mask_spec, out, lse = residuals
    d_out, d_lse = (c.astype(jnp.float32) for c in cotangents)
    bq, bk = config.blocks.block_q, config.blocks.block_k
    num_kv, tq, ts = k.shape[1], q.shape[2], k.shape[2]
    # FlashAttention-2: d logits = p * (d_out·v - rowsum(d_out * out)); lse adds p * d_lse.
    delta = jnp.sum(d_out * out, axis=-1) - d_lse
    zeros = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, jnp.float32))

    def key_block(carry, j):
        k_start = j * bk
        k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, bk, axis=2)
        v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, bk, axis=2).astype(jnp.float32)

        def body(i, inner):
            dq, d_params, d_bias, d_temp, dk_blk, dv_blk = inner
            q_start = i * bq
            rows = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=q_start, axis=2)
            q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, bq, axis=2)
            bias_blk = tile(bias, q_start, k_start, bq, bk)
            temp_blk = tile(temperature, q_start, k_start, bq, bk)
            s, vjp = jax.vjp(
                functools.partial(_tile_logits, config), q_blk, k_blk, params, bias_blk, temp_blk
            )
            tile_mask = _tile_mask(config, mask, mask_spec, q_start, k_start)
            p = recomputed_probs(s, rows(lse, slice_size=bq), tile_mask)
            do_blk = _group(rows(d_out, slice_size=bq), num_kv)
            dv_blk = dv_blk + jnp.einsum("bkgts,bkgth->bksh", _group(p, num_kv), do_blk)
            dp = jnp.einsum("bkgth,bksh->bkgts", do_blk, v_blk).reshape(p.shape)
            ds = p * (dp - rows(delta, slice_size=bq)[..., None])
            dq_t, dk_t, dparams_t, dbias_t, dtemp_t = vjp(ds)
            dq = jax.lax.dynamic_update_slice_in_dim(
                dq, rows(dq, slice_size=bq) + dq_t, q_start, axis=2
            )
            d_params = jax.tree.map(jnp.add, d_params, dparams_t)
            d_bias = tile_add(d_bias, q_start, k_start, dbias_t)
            d_temp = tile_add(d_temp, q_start, k_start, dtemp_t)
            return dq, d_params, d_bias, d_temp, dk_blk + dk_t, dv_blk

        lo, hi = query_block_range(mask_spec, k_start, bq, bk, tq // bq)
        init = (*carry, jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(v_blk.shape, jnp.float32))
        *carry, dk_blk, dv_blk = jax.lax.fori_loop(lo, hi, body, tuple(init))
        return tuple(carry), (dk_blk, dv_blk)

    init = (zeros(q), zeros(params), zeros(bias), zeros(temperature))
    (dq, d_params, d_bias, d_temp), (dk, dv) = jax.lax.scan(key_block, init, jnp.arange(ts // bk))
    dk, dv = (jnp.moveaxis(x, 0, 2).reshape((*x.shape[1:3], ts, x.shape[-1])) for x in (dk, dv))
    cast = functools.partial(jax.tree.map, lambda g, x: g.astype(x.dtype))
    return (
        *cast((dq, dk, dv, d_params, d_bias, d_temp), (q, k, v, params, bias, temperature)),
        None,
        None,
    )


_attention.defvjp(_attention_fwd, _attention_bwd)
