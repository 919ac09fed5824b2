"""The chunked XLA implementation: an online softmax over tiles, O(T) memory forward and backward.

The forward pass visits each query block's key blocks with a running maximum, running sum and
rescaled accumulator (FlashAttention). Which tiles are visited comes from their kinds
(:meth:`attnjax.masks.MaskSpec.classify` and the block mask): empty tiles are skipped, full
ones run without evaluating the rules or ``mask_mod``. A ``jax.custom_vjp`` recomputes each
tile's logits in the backward pass (FlashAttention-2), so nothing of size ``[T, S]`` is ever
stored. A tile's logits come from :meth:`attnjax.call.AttentionCall.logits`, differentiated
with ``jax.vjp``: every score and ``score_mod`` works, with gradients for ``score_params``,
``bias``, ``temperature`` and the float leaves of ``mod_params``.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from attnjax.call import AttentionCall, merge_floats, split_floats
from attnjax.masks import EMPTY, FULL, TileKinds, combine
from attnjax.softmax import online_finish, online_init, online_step, recomputed_probs
from attnjax.tiling import BlockSizes, as_4d, pad_axis, pad_tiles, round_up, tile, tile_add

DEFAULT_BLOCKS = BlockSizes(block_q=1024, block_k=128)
# Scores with hidden features hold a [B, N, block_q, block_k, A] tile: keep it small.
DEFAULT_HIDDEN_BLOCKS = BlockSizes(block_q=128, block_k=128)


def chunked_attention(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
) -> tuple[Float[Array, "B T N Hv"], None, Float[Array, "B N T"]]:
    """Attention on already validated inputs: ``(output, None, log-sum-exp)``.

    Same contract as :func:`attnjax.dense.dense_attention`, except that the ``[B, N, T, S]``
    weights are never formed (``None`` is returned in their place). Tiles are the block
    mask's, else ``call.block_sizes``, else ``DEFAULT_HIDDEN_BLOCKS`` for scores with hidden
    features and ``DEFAULT_BLOCKS`` otherwise; lengths that are not multiples of them are
    padded inside.
    """
    num_queries = query.shape[1]
    out, lse = _attention(*_prepared(query, key, value, call))
    out = jnp.swapaxes(out[:, :, :num_queries], 1, 2).astype(query.dtype)
    return out, None, lse[:, :, :num_queries]


def chunked_share(
    query: Float[Array, "B T N H"],
    key: Float[Array, "B S K H"],
    value: Float[Array, "B S K Hv"],
    call: AttentionCall,
    out: Float[Array, "B T N Hv"],
    lse: Float[Array, "B N T"],
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "B N T"]]:
    """``(out, lse)`` unchanged: the output and log-sum-exp of attention over a longer key
    sequence, of which ``key`` and ``value`` are one block. Its VJP is this block's share of
    their gradients (FlashAttention-2's backward, the tiles' probabilities normalized by
    ``lse``), so the blocks of a split key sequence are differentiated one at a time, each in
    O(T) memory (ring attention, :mod:`attnjax.sharded`)."""
    config, q, k, v, diff, rest, schedule = _prepared(query, key, value, call)
    num_queries, tq = query.shape[1], q.shape[2]
    out_p = pad_axis(jnp.swapaxes(out, 1, 2).astype(jnp.float32), 2, tq)
    lse_p = pad_axis(lse.astype(jnp.float32), 2, tq, -jnp.inf)
    out_p, lse_p = _share(config, q, k, v, diff, rest, schedule, out_p, lse_p)
    out_p, lse_p = out_p[:, :, :num_queries], lse_p[:, :, :num_queries]
    return jnp.swapaxes(out_p, 1, 2).astype(out.dtype), lse_p


def _prepared(query, key, value, call):
    """``(config, q, k, v, diff, rest, schedule)``: inputs head-major and padded to whole
    tiles, the call split into its differentiable parts and the rest, the tiles to visit."""
    num_queries, num_keys = query.shape[1], key.shape[1]
    default = DEFAULT_BLOCKS if call.score_hidden is None else DEFAULT_HIDDEN_BLOCKS
    blocks = call.blocks(default).clamp(num_queries, num_keys)
    config = _Config(
        blocks=blocks,
        num_queries=num_queries,
        num_keys=num_keys,
        rules=call.mask_mod is not None or call.mask_spec.active,
    )
    tq, ts = round_up(num_queries, blocks.block_q), round_up(num_keys, blocks.block_k)
    q = pad_axis(jnp.swapaxes(query, 1, 2), 2, tq)
    k = pad_axis(jnp.swapaxes(key, 1, 2), 2, ts)
    v = pad_axis(jnp.swapaxes(value, 1, 2), 2, ts)
    call = dataclasses.replace(
        call,
        bias=pad_tiles(as_4d(call.bias), tq, ts, 1),
        temperature=pad_tiles(as_4d(call.temperature), tq, ts, 1),
        mask=pad_tiles(as_4d(call.mask), tq, ts, False),
    )
    schedule = _Schedule.of(
        call.tile_kinds((query.shape[0], query.shape[2]), num_queries, num_keys, blocks)
    )
    mod_floats, mod_data = split_floats(call.mod_params)
    diff = (call.score_params, call.bias, call.temperature, mod_floats)
    rest = dataclasses.replace(
        call, score_params=None, bias=None, temperature=None, mod_params=mod_data
    )
    return config, q, k, v, diff, rest, schedule


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static part of one call: the clamped blocks, the unpadded lengths, and whether
    any rule or ``mask_mod`` masks elements (else every tile is visited and full, and the
    loops have static trip counts: a dynamic one costs XLA one more tile of memory in the
    backward pass, measured with additive scores)."""

    blocks: BlockSizes
    num_queries: int
    num_keys: int
    rules: bool


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["key_blocks", "key_counts", "query_blocks", "query_counts", "full"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class _Schedule:
    """The tiles to visit: per query block, its non-empty key blocks first (``key_blocks
    [Tq, Sk]``, ``key_counts [Tq]``), the same per key block for the backward pass, and
    ``full [Tq, Sk]``: the tile needs no rule evaluated for any (batch, head)."""

    # A pytree: JAX rebuilds it with placeholder leaves, so runtime type checkers skip __init__.
    __no_type_check__ = True

    key_blocks: Int[Array, "Tq Sk"]
    key_counts: Int[Array, " Tq"]
    query_blocks: Int[Array, "Sk Tq"]
    query_counts: Int[Array, " Sk"]
    full: Bool[Array, "Tq Sk"]

    @classmethod
    def of(cls, kinds: TileKinds) -> "_Schedule":
        """A tile is visited when any (batch, head) sees part of it."""
        visit = jnp.max(kinds, axis=(0, 1)) > EMPTY
        first = functools.partial(jnp.argsort, axis=1, stable=True)
        skip = (~visit).astype(jnp.int8)
        return cls(
            key_blocks=first(skip).astype(jnp.int32),
            key_counts=jnp.sum(visit, axis=1, dtype=jnp.int32),
            query_blocks=first(skip.T).astype(jnp.int32),
            query_counts=jnp.sum(visit, axis=0, dtype=jnp.int32),
            full=jnp.min(kinds, axis=(0, 1)) == FULL,
        )


def _logits(config, call, q, k, q_idx, k_idx, params, bias, temperature, mod_params):
    """A tile's logits ``[B, N, bq, bk]``, the key heads repeated for grouped attention; mods
    see the positions clamped to the sequences (never the padding)."""
    k = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1)
    extent = (config.num_queries, config.num_keys)
    return call.logits(q, k, q_idx, k_idx, params, bias, temperature, mod_params, extent)


def _tile_mask(config, call, batch_heads, full, q_start, k_start):
    """The mask of tile ``(q_start, k_start)`` for ``batch_heads = (B, N)``: the dense mask,
    padded keys, and, unless the tile is ``full``, the rules and ``mask_mod`` (evaluated on
    partial tiles only); ``None`` when nothing is masked."""
    bq, bk = config.blocks.block_q, config.blocks.block_k
    q_idx, k_idx = q_start + jnp.arange(bq), k_start + jnp.arange(bk)
    padded = (k_idx < config.num_keys)[None, None, None, :] if config.num_keys % bk else None
    ruled = None
    if config.rules:

        def rules():
            extent = (config.num_queries, config.num_keys)
            return call.element_mask(batch_heads, q_idx, k_idx, None, call.mod_params, extent)

        shape = jax.eval_shape(rules).shape
        ruled = jax.lax.cond(full, lambda: jnp.ones(shape, bool), rules)
    return combine(tile(call.mask, q_start, k_start, bq, bk), padded, ruled)


def _group(x: Array, num_kv_heads: int) -> Array:
    """``[B, N, ...] -> [B, K, N // K, ...]``."""
    return x.reshape(x.shape[0], num_kv_heads, -1, *x.shape[2:])


def _join(diff, rest) -> AttentionCall:
    """The call from its differentiable parts (score parameters, bias, temperature, float
    mod parameters) and the rest (the custom VJP keeps them apart: the rest gets no
    cotangent)."""
    score_params, bias, temperature, mod_floats = diff
    return dataclasses.replace(
        rest,
        score_params=score_params,
        bias=bias,
        temperature=temperature,
        mod_params=merge_floats(mod_floats, rest.mod_params),
    )


def _forward(config, q, k, v, diff, rest, schedule):
    call = _join(diff, rest)
    bq, bk = config.blocks.block_q, config.blocks.block_k
    batch, heads, tq, _ = q.shape
    num_kv, hv = k.shape[1], v.shape[3]

    def query_block(i):
        q_start = i * bq
        q_blk = jax.lax.dynamic_slice_in_dim(q, q_start, bq, axis=2)
        q_idx = q_start + jnp.arange(bq)

        def body(n, carry):
            j = schedule.key_blocks[i, n]
            k_start = j * bk
            k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, bk, axis=2)
            v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, bk, axis=2).astype(jnp.float32)
            s = _logits(
                config,
                call,
                q_blk,
                k_blk,
                q_idx,
                k_start + jnp.arange(bk),
                call.score_params,
                tile(call.bias, q_start, k_start, bq, bk),
                tile(call.temperature, q_start, k_start, bq, bk),
                call.mod_params,
            )

            def weighted_sum(p):
                pv = jnp.einsum("bkgts,bksh->bkgth", _group(p, num_kv), v_blk)
                return pv.reshape(batch, heads, bq, hv)

            mask = _tile_mask(config, call, (batch, heads), schedule.full[i, j], q_start, k_start)
            return online_step(carry, s, mask, weighted_sum)

        init = online_init((batch, heads, bq), hv)
        count = schedule.key_counts[i] if config.rules else k.shape[2] // bk
        return online_finish(jax.lax.fori_loop(0, count, body, init))

    out, lse = jax.lax.map(query_block, jnp.arange(tq // bq, dtype=jnp.int32))
    out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, tq, hv)
    return out, jnp.moveaxis(lse, 0, 2).reshape(batch, heads, tq)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, diff, rest, schedule):
    return _forward(config, q, k, v, diff, rest, schedule)


def _attention_fwd(config, q, k, v, diff, rest, schedule):
    out, lse = _forward(config, q, k, v, diff, rest, schedule)
    return (out, lse), (q, k, v, diff, rest, schedule, out, lse)


def _attention_bwd(config, residuals, cotangents):
    q, k, v, diff, rest, schedule, out, lse = residuals
    call, mod_floats, mod_data = _join(diff, rest), diff[3], rest.mod_params
    d_out, d_lse = (c.astype(jnp.float32) for c in cotangents)
    bq, bk = config.blocks.block_q, config.blocks.block_k
    batch, heads = q.shape[:2]
    num_kv, ts = k.shape[1], k.shape[2]
    # FlashAttention-2: d logits = p * (d_out·v - rowsum(d_out * out)); lse adds p * d_lse.
    delta = jnp.sum(d_out * out, axis=-1) - d_lse
    zeros = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, jnp.float32))

    def tile_logits(q_blk, k_blk, params, bias, temperature, floats, *, q_idx, k_idx):
        mod_params = merge_floats(floats, mod_data)
        return _logits(
            config, call, q_blk, k_blk, q_idx, k_idx, params, bias, temperature, mod_params
        )

    def key_block(carry, j):
        k_start = j * bk
        k_blk = jax.lax.dynamic_slice_in_dim(k, k_start, bk, axis=2)
        v_blk = jax.lax.dynamic_slice_in_dim(v, k_start, bk, axis=2).astype(jnp.float32)
        k_idx = k_start + jnp.arange(bk)

        def body(n, inner):
            dq, d_params, d_bias, d_temp, d_mod, dk_blk, dv_blk = inner
            i = schedule.query_blocks[j, n]
            q_start = i * bq
            rows = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=q_start, axis=2)
            q_blk = rows(q, slice_size=bq)
            bias_blk = tile(call.bias, q_start, k_start, bq, bk)
            temp_blk = tile(call.temperature, q_start, k_start, bq, bk)
            logits = functools.partial(tile_logits, q_idx=q_start + jnp.arange(bq), k_idx=k_idx)
            s, vjp = jax.vjp(
                logits,
                q_blk,
                k_blk,
                call.score_params,
                bias_blk,
                temp_blk,
                mod_floats,
            )
            mask = _tile_mask(config, call, (batch, heads), schedule.full[i, j], q_start, k_start)
            p = recomputed_probs(s, rows(lse, slice_size=bq), mask)
            do_blk = _group(rows(d_out, slice_size=bq), num_kv)
            dv_blk = dv_blk + jnp.einsum("bkgts,bkgth->bksh", _group(p, num_kv), do_blk)
            dp = jnp.einsum("bkgth,bksh->bkgts", do_blk, v_blk).reshape(p.shape)
            ds = p * (dp - rows(delta, slice_size=bq)[..., None])
            dq_t, dk_t, dparams_t, dbias_t, dtemp_t, dmod_t = vjp(ds)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, rows(dq, slice_size=bq) + dq_t, q_start, 2)
            return (
                dq,
                jax.tree.map(jnp.add, d_params, dparams_t),
                tile_add(d_bias, q_start, k_start, dbias_t),
                tile_add(d_temp, q_start, k_start, dtemp_t),
                jax.tree.map(jnp.add, d_mod, dmod_t),
                dk_blk + dk_t,
                dv_blk,
            )

        init = (*carry, jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(v_blk.shape, jnp.float32))
        count = schedule.query_counts[j] if config.rules else q.shape[2] // bq
        *carry, dk_blk, dv_blk = jax.lax.fori_loop(0, count, body, init)
        return tuple(carry), (dk_blk, dv_blk)

    init = (
        zeros(q),
        zeros(call.score_params),
        zeros(call.bias),
        zeros(call.temperature),
        zeros(mod_floats),
    )
    (dq, d_params, d_bias, d_temp, d_mod), (dk, dv) = jax.lax.scan(
        key_block, init, jnp.arange(ts // bk, dtype=jnp.int32)
    )
    dk, dv = (jnp.moveaxis(x, 0, 2).reshape((*x.shape[1:3], ts, x.shape[-1])) for x in (dk, dv))
    cast = functools.partial(jax.tree.map, lambda g, x: g.astype(x.dtype))
    d_diff = cast((d_params, d_bias, d_temp, d_mod), diff)
    return (*cast((dq, dk, dv), (q, k, v)), d_diff, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _share(config, q, k, v, diff, rest, schedule, out, lse):
    return out, lse


def _share_fwd(config, q, k, v, diff, rest, schedule, out, lse):
    return (out, lse), (q, k, v, diff, rest, schedule, out, lse)


def _share_bwd(config, residuals, cotangents):
    return (*_attention_bwd(config, residuals, cotangents), None, None)


_share.defvjp(_share_fwd, _share_bwd)
