"""One attention call, validated once: the object every implementation receives.

:func:`prepare` checks and normalizes the arguments of :func:`attnjax.attention` and returns an
:class:`AttentionCall` (a pytree). Its :meth:`~AttentionCall.logits` and
:meth:`~AttentionCall.element_mask` compute the logits and mask of any block of positions, the
full matrix (dense) or one tile (chunked), so no implementation can drop an argument.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from attnjax.masks import (
    PARTIAL,
    BlockMask,
    MaskSpec,
    TileKinds,
    block_mask,
    combine,
    mod_indices,
)
from attnjax.masks.checks import check_closure, check_signature, read_paths, run_mod, same_mod
from attnjax.scores import SCORES
from attnjax.tiling import BlockSizes, as_4d

ScoreFn = Callable[[Array, Array, Any], Float[Array, "B N T S"]]
ScoreMod = Callable[..., Float[Array, "B N T S"]]
MaskMod = Callable[..., Bool[Array, "#B #N #T #S"]]


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "score_params",
        "bias",
        "mask",
        "temperature",
        "mask_spec",
        "mod_params",
        "block_mask",
    ],
    meta_fields=["score", "score_name", "score_hidden", "score_mod", "mask_mod", "block_sizes"],
)
@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """Everything but ``query``, ``key``, ``value``; batched (``B`` leads every array).

    ``score(q [B, N, T, H], k [B, N, S, H], score_params)`` gives the logits;
    ``score_name`` is its registry name (``None`` for callables); ``score_hidden`` the width
    ``A`` of the ``[..., T, S, A]`` hidden features it forms (additive scores), else ``None``.
    Score parameters and mod parameters hold arrays only.
    """

    # A pytree: JAX rebuilds it with placeholder leaves, so runtime type checkers skip __init__.
    __no_type_check__ = True

    score: ScoreFn
    score_params: Any
    score_name: str | None = None
    score_hidden: int | None = None
    bias: Float[Array, "..."] | None = None  # broadcastable to [B, N, T, S]
    mask: Bool[Array, "..."] | None = None
    temperature: Float[Array, "..."] | None = None
    mask_spec: MaskSpec = dataclasses.field(default_factory=MaskSpec)
    score_mod: ScoreMod | None = None
    mask_mod: MaskMod | None = None
    mod_params: Any = None
    block_mask: BlockMask | None = None
    block_sizes: BlockSizes | None = None

    @property
    def has_mods(self) -> bool:
        return self.score_mod is not None or self.mask_mod is not None

    def logits(
        self, q, k, q_idx, k_idx, score_params, bias, temperature, mod_params, extent=None
    ) -> Float[Array, "B N Tb Sb"]:
        """``score_mod((score(q, k) + bias) / temperature, b, h, q_idx, kv_idx)`` in float32.

        ``q [B, N, Tb, H]`` and ``k [B, N, Sb, H]`` hold positions ``q_idx`` and ``k_idx``;
        the other arrays are already the block's (they are arguments so they can be
        differentiated). ``extent = (T, S)`` clamps the positions the mod sees (tiles past
        the sequences' ends: :func:`attnjax.masks.mod_indices`).
        """
        logits = self.score(q.astype(jnp.float32), k.astype(jnp.float32), score_params)
        logits = logits.astype(jnp.float32)
        if bias is not None:
            logits = logits + bias
        if temperature is not None:
            logits = logits / temperature
        if self.score_mod is None:
            return logits
        idx = mod_indices(*q.shape[:2], q_idx, k_idx, self.mask_spec.offset, extent)
        modded = run_mod("score_mod", self.score_mod, (logits, *idx), mod_params)
        if jnp.shape(modded) != logits.shape:
            raise ValueError(
                f"score_mod: must return logits of the shape it was given, {logits.shape}; "
                f"got {jnp.shape(modded)}"
            )
        return jnp.asarray(modded, jnp.float32)

    def element_mask(
        self, shape, q_idx, k_idx, mask_tile, mod_params, extent=None
    ) -> Bool[Array, "..."] | None:
        """The block's mask: the structured rules ∧ the dense ``mask_tile`` ∧ ``mask_mod``;
        ``shape`` is ``(B, N)``; ``extent`` as in :meth:`logits`."""
        mod = None
        if self.mask_mod is not None:
            idx = mod_indices(*shape, q_idx, k_idx, self.mask_spec.offset, extent)
            mod = jnp.asarray(run_mod("mask_mod", self.mask_mod, idx, mod_params))
            if mod.dtype != bool:
                raise TypeError(
                    f"mask_mod: must return booleans (True = may attend), got {mod.dtype}"
                )
        return combine(self.mask_spec.block(q_idx, k_idx), mask_tile, mod)

    def tile_kinds(
        self, batch_heads: tuple[int, int], num_queries: int, num_keys: int, blocks: BlockSizes
    ) -> TileKinds:
        """Each tile's kind under the structured rules and the block mask, built here from
        ``mask_mod`` when none was given. A block mask built for another ``causal_offset``
        (possibly known only at run time) classifies nothing: its tiles all count as partial."""
        kinds = self.mask_spec.classify(num_queries, num_keys, blocks)
        block = self.block_mask
        if block is not None:
            same_offset = jnp.asarray(block.offset) == self.mask_spec.offset
            return jnp.minimum(kinds, jnp.where(same_offset, block.kinds, PARTIAL))
        if self.mask_mod is not None:
            block = block_mask(
                self.mask_mod,
                self.mod_params,
                *batch_heads,
                num_queries,
                num_keys,
                blocks,
                causal_offset=self.mask_spec.offset,
            )
            kinds = jnp.minimum(kinds, block.kinds)
        return kinds

    def blocks(self, default: BlockSizes | None) -> BlockSizes | None:
        """The tiles to use: the block mask's, else ``block_sizes``, else ``default``."""
        if self.block_mask is not None:
            return self.block_mask.block_sizes
        return self.block_sizes or default


def split_floats(tree: Any) -> tuple[Any, Any]:
    """``(floats, others)``: the tree with ``None`` in place of the other leaves, and the
    reverse. Float leaves are differentiable; integer and boolean leaves are data."""
    is_float = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in jax.tree.leaves(tree)]
    leaves, treedef = jax.tree.flatten(tree)
    floats = [x if f else None for x, f in zip(leaves, is_float, strict=True)]
    others = [None if f else x for x, f in zip(leaves, is_float, strict=True)]
    return treedef.unflatten(floats), treedef.unflatten(others)


def merge_floats(floats: Any, others: Any) -> Any:
    """The inverse of :func:`split_floats`."""
    return jax.tree.map(
        lambda f, o: o if f is None else f, floats, others, is_leaf=lambda x: x is None
    )


def prepare(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    score,
    score_params,
    scale,
    temperature,
    score_mod,
    mask_mod,
    mod_params,
    block_mask,
    block_sizes,
    **options,
) -> tuple[Array, Array, Array, AttentionCall, bool]:
    """``(query, key, value, call, batched)`` from :func:`attnjax.attention`'s arguments:
    inputs made batched, every argument checked (``options`` holds the structured mask
    arguments and those the call does not carry, such as ``implementation``)."""
    mask_args = {name: options[name] for name in _MASK_ARGS}
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    batched = query.ndim == 4
    _check_qkv(query, key, value)
    if not batched:
        query, key, value = query[None], key[None], value[None]
        mask_args = _batch_mask_args(mask_args)
    batch, num_queries, num_heads, head_dim = query.shape
    num_keys = key.shape[1]
    logits_shape = (batch, num_heads, num_queries, num_keys)
    if mask is not None and jnp.asarray(mask).dtype != bool:
        raise TypeError(
            f"mask: expected a boolean array (True = may attend), got dtype "
            f"{jnp.asarray(mask).dtype}; pass additive masks as `bias`"
        )
    broadcast = functools.partial(_check_broadcast, logits_shape=logits_shape, batched=batched)
    fn, params, hidden = _resolve_score(score, score_params, scale, num_heads, head_dim)
    mask_spec = _mask_spec(mask_args, batch, num_queries, num_keys)
    mask_mod, block_mask = _check_mods(score_mod, mask_mod, block_mask, block_sizes, logits_shape)
    if block_mask is not None:
        mod_params = _tie(block_mask, mod_params)
    call = AttentionCall(
        score=fn,
        score_params=params,
        score_name=score if isinstance(score, str) else None,
        score_hidden=hidden,
        bias=broadcast("bias", bias),
        mask=broadcast("mask", mask),
        temperature=broadcast("temperature", _check_temperature(temperature)),
        mask_spec=mask_spec,
        score_mod=score_mod,
        mask_mod=mask_mod,
        mod_params=jax.tree.map(jnp.asarray, mod_params),
        block_mask=block_mask,
        block_sizes=block_sizes,
    )
    return query, key, value, call, batched


_MASK_ARGS = (
    "is_causal",
    "causal_offset",
    "query_seq_lengths",
    "key_value_seq_lengths",
    "q_segment_ids",
    "kv_segment_ids",
    "local_window_size",
)


def _batch_mask_args(args: dict[str, Any]) -> dict[str, Any]:
    """Unbatched lengths and segment ids with a batch of one."""
    batched = dict(args)
    for name in ("query_seq_lengths", "key_value_seq_lengths"):
        if args[name] is not None:
            batched[name] = jnp.reshape(args[name], (1,))
    for name in ("q_segment_ids", "kv_segment_ids"):
        if args[name] is not None:
            batched[name] = jnp.asarray(args[name])[None]
    return batched


def _mask_spec(args: dict[str, Any], batch: int, num_queries: int, num_keys: int) -> MaskSpec:
    return MaskSpec(
        is_causal=bool(args["is_causal"]),
        window=_check_window(args["local_window_size"]),
        offset=jnp.asarray(args["causal_offset"], jnp.int32),
        q_lengths=_check_lengths("query_seq_lengths", args["query_seq_lengths"], batch),
        kv_lengths=_check_lengths("key_value_seq_lengths", args["key_value_seq_lengths"], batch),
        **_check_segments(
            args["q_segment_ids"], args["kv_segment_ids"], batch, num_queries, num_keys
        ),
    )


def _check_mods(score_mod, mask_mod, block_mask, block_sizes, logits_shape):
    """``(mask_mod, block_mask)``, the mask mod taken from the block mask when not given."""
    for name, mod in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if mod is not None and not callable(mod):
            raise TypeError(f"{name}: expected a callable or None, got {mod!r}")
        if mod is not None:
            check_signature(name, mod)
            check_closure(name, mod)
    if block_mask is None:
        return mask_mod, None
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask: expected attnjax.masks.BlockMask or None, got {block_mask!r}")
    if mask_mod is not None and not same_mod(mask_mod, block_mask.mask_mod):
        raise ValueError(
            "mask_mod: differs from the one block_mask was built from (mods are compared by "
            "code and closed-over values); pass block_mask alone (its mask_mod is used) or "
            "build it from this mask_mod"
        )
    batch, heads, num_queries, num_keys = logits_shape
    kinds = block_mask.kinds.shape
    if (
        (block_mask.num_queries, block_mask.num_keys) != (num_queries, num_keys)
        or kinds[0]
        not in (
            1,
            batch,
        )
        or kinds[1] not in (1, heads)
    ):
        raise ValueError(
            f"block_mask: built for [{kinds[0]}, {kinds[1]}, {block_mask.num_queries}, "
            f"{block_mask.num_keys}], which does not broadcast to this call's [B, N, T, S] = "
            f"{list(logits_shape)}"
        )
    if block_sizes is not None and block_sizes != block_mask.block_sizes:
        raise ValueError(
            f"block_sizes: {block_sizes} differs from the block mask's {block_mask.block_sizes}; "
            "the tiles are the block mask's (leave block_sizes out)"
        )
    return block_mask.mask_mod, block_mask


def _tie(block_mask: BlockMask, mod_params: Any) -> Any:
    """The call's ``mod_params`` with a block mask, checked against the data it was built
    from, so its tiles and the elements never disagree.

    The leaves ``mask_mod`` reads from the block mask's ``mod_params`` must be this call's:
    the same arrays, or equal values. A dict of ``mod_params`` that lacks them takes them from
    the block mask. Other values under those keys (a stale block mask: new document ids) are
    an error; so are traced arrays that are other objects than the block mask's, which cannot
    be compared (build the block mask from the same arrays, inside the traced function)."""
    data = block_mask.mod_params
    if data is None or mod_params is None or mod_params is data:
        return data if mod_params is None else mod_params
    if isinstance(data, dict) and isinstance(mod_params, dict):
        mod_params = {**data, **mod_params}
    batch, heads = block_mask.kinds.shape[:2]
    indices = mod_indices(batch, heads, jnp.arange(1), jnp.arange(1), block_mask.offset)
    given = dict(jax.tree_util.tree_flatten_with_path(mod_params)[0])
    read = read_paths(block_mask.mask_mod, data, indices)
    for path, built in jax.tree_util.tree_flatten_with_path(data)[0]:
        name, value = f"mod_params{jax.tree_util.keystr(path)}", given.get(path)
        if path not in read or value is built:
            continue
        if isinstance(value, jax.core.Tracer) or isinstance(built, jax.core.Tracer):
            raise ValueError(
                f"block_mask: {name} is traced and not the array the block mask was built "
                "from, so it cannot be checked against it; build the block mask from these "
                "mod_params inside the traced function, or leave that key out of mod_params "
                "(the block mask's own is then used)"
            )
        if value is None or not _equal_values(value, built):
            raise ValueError(
                f"block_mask: built from another {name} than this call's (a stale block "
                "mask: e.g. other document ids); rebuild it with attnjax.masks.block_mask "
                "from these mod_params, or pass mod_params only through the block mask"
            )
    return mod_params


def _equal_values(a: Any, b: Any) -> bool:
    """Concrete arrays of the same shape and values (dtypes may differ)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _check_qkv(query: Array, key: Array, value: Array) -> None:
    shapes = f"query {query.shape}, key {key.shape}, value {value.shape}"
    if query.ndim not in (3, 4) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(
            f"query, key, value: expected ranks 4 ([B, T, N, H], [B, S, K, H], [B, S, K, Hv]) "
            f"or 3 (unbatched), all equal; got {shapes}"
        )
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(
                f"{name}: expected a floating-point array, got {x.dtype} (jax.nn would return "
                f"a truncated integer output); cast it, e.g. {name}.astype(jnp.float32)"
            )
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"query, key, value: expected one dtype, as jax.nn does; got {query.dtype}, "
            f"{key.dtype}, {value.dtype} (cast them, e.g. key.astype(query.dtype))"
        )
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"key, value: batch, length and head dims must match; got {shapes}")
    if query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"query, key: batch dims must match; got {shapes}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query, key: head size H must match; got {shapes}")
    num_heads, num_kv_heads = query.shape[-2], key.shape[-2]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads N={num_heads} must be a multiple of key/value heads K={num_kv_heads}; "
            f"got {shapes}"
        )


def _check_broadcast(
    name: str, x: ArrayLike | None, logits_shape: tuple[int, ...], batched: bool
) -> Array | None:
    """``x`` must broadcast to ``[B, N, T, S]`` (``[N, T, S]`` for unbatched inputs); returned
    4-D (size-1 axes prefixed), so it broadcasts without rank promotion."""
    if x is None:
        return None
    x = jnp.asarray(x)
    target = logits_shape if batched else logits_shape[1:]
    try:
        ok = x.ndim <= len(target) and np.broadcast_shapes(x.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {x.shape} does not broadcast to {target} ([B, N, T, S])")
    return as_4d(x)


def _check_temperature(temperature: ArrayLike | None) -> Array | None:
    if temperature is None:
        return None
    if not isinstance(temperature, jax.core.Tracer) and not np.all(np.asarray(temperature) > 0):
        raise ValueError(f"temperature: expected values > 0, got {temperature!r}")
    return jnp.asarray(temperature, jnp.float32)


def _check_window(window: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if window is None:
        return None
    pair = (window, window) if isinstance(window, int) else tuple(window)
    if len(pair) != 2 or not all(isinstance(w, int) and w >= 0 for w in pair):
        raise ValueError(
            f"local_window_size: expected an int >= 0 or a pair (left, right) of them, "
            f"got {window!r}"
        )
    return pair


def _check_lengths(name: str, lengths: ArrayLike | None, batch: int) -> Array | None:
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"{name}: expected an integer array of shape ({batch},), "
            f"got {lengths.dtype} {lengths.shape}"
        )
    return lengths


def _check_segments(
    q_ids: ArrayLike | None, kv_ids: ArrayLike | None, batch: int, num_q: int, num_kv: int
) -> dict[str, Array | None]:
    if q_ids is None and kv_ids is None:
        return {}
    if q_ids is None or kv_ids is None:
        raise ValueError("q_segment_ids, kv_segment_ids: pass both or neither")
    q_ids, kv_ids = jnp.asarray(q_ids), jnp.asarray(kv_ids)
    if q_ids.shape != (batch, num_q) or kv_ids.shape != (batch, num_kv):
        raise ValueError(
            f"q_segment_ids, kv_segment_ids: expected shapes ({batch}, {num_q}) and "
            f"({batch}, {num_kv}), got {q_ids.shape} and {kv_ids.shape}"
        )
    return {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids}


def _resolve_score(
    score: str | Callable, params: Any, scale: float | None, num_heads: int, head_dim: int
) -> tuple[ScoreFn, Any, int | None]:
    """``(fn, params, hidden)``: a callable ``(q, k, params) -> logits``, its parameters as
    arrays, and the hidden width ``A`` of additive scores (else ``None``)."""
    if scale is not None and score != "scaled_dot":
        raise ValueError(
            f"scale: applies to score='scaled_dot' only, got score={score!r} "
            "(cosine takes score_params={'scale': ...}; callables scale themselves)"
        )
    if callable(score):
        return score, jax.tree.map(jnp.asarray, params), None
    if score not in SCORES:
        raise ValueError(f"score: expected one of {sorted(SCORES)} or a callable, got {score!r}")
    spec = SCORES[score]
    params = dict(params or {})
    if score == "scaled_dot":
        if scale is not None and "scale" in params:
            raise ValueError("scale: given both as `scale` and in score_params; pass one")
        params.setdefault("scale", 1.0 / math.sqrt(head_dim) if scale is None else scale)
    unknown = sorted(set(params) - set(spec.params))
    missing = sorted(set(spec.required) - set(params))
    if unknown or missing:
        raise ValueError(
            f"score_params for score={score!r}: expected keys {sorted(spec.params)} "
            f"(required {sorted(spec.required)}); unknown {unknown}, missing {missing}"
        )
    sizes = {"H": head_dim}
    for name, value in params.items():
        _check_param(score, name, jnp.shape(value), spec.params[name], sizes, num_heads)

    def score_fn(q: Array, k: Array, p: dict[str, Array]) -> Array:
        return spec.fn(q, k, **p)

    params = {name: jnp.asarray(value, jnp.float32) for name, value in params.items()}
    return score_fn, params, sizes.get("A") if spec.hidden else None


def _check_param(
    score: str,
    name: str,
    shape: tuple[int, ...],
    trailing: tuple[str, ...],
    sizes: dict[str, int],
    num_heads: int,
) -> None:
    """Trailing dims as declared (``"A"`` shared by all parameters); leading dims () or (N,)."""
    n = len(trailing)
    lead, tail = shape[: len(shape) - n], shape[len(shape) - n :]
    ok = (
        len(shape) >= n
        and lead in ((), (1,), (num_heads,))
        and all(sizes.setdefault(s, d) == d for d, s in zip(tail, trailing, strict=True))
    )
    if not ok:
        expected = ", ".join(f"{s}={sizes[s]}" if s in sizes else s for s in trailing)
        raise ValueError(
            f"score_params[{name!r}] for score={score!r}: expected shape [{expected}] with an "
            f"optional leading head dim N={num_heads}, got {shape}"
        )
