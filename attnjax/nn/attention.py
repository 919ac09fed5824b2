"""``MultiHeadAttention``: projections, optional QK-norm and RoPE, a score module, optional
per-head gates, all on top of :func:`attnjax.attention`."""

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype
from flax.nnx.nn.linear import default_kernel_init
from jaxtyping import Array, Bool, Float, Int, Shaped

from attnjax.attention import attention
from attnjax.call import MaskMod, ScoreMod
from attnjax.masks import BlockMask
from attnjax.nn import hooks
from attnjax.nn.batching import flatten_batch, unflatten_batch
from attnjax.nn.mods import split_mod
from attnjax.nn.positional import default_positions, rope
from attnjax.nn.scores import make_score
from attnjax.sharded import SequenceParallel

DENSE = "xla"  # the implementation that materializes the weights
ZEROS = nnx.initializers.zeros_init()
NO_METADATA: Mapping[str, Any] = MappingProxyType({})
_PACKING = ("q_segment_ids", "kv_segment_ids", "query_seq_lengths", "key_value_seq_lengths")
# attention() keywords with batch dimensions: the number of dimensions after them
_BATCHED = {"bias": 3, "q_segment_ids": 1, "kv_segment_ids": 1, "query_seq_lengths": 0,
            "key_value_seq_lengths": 0}  # fmt: skip


class HeadGate(nnx.Variable):
    """Per-head output multipliers ``[N]`` (:func:`add_head_gates`). Not an ``nnx.Param``:
    optimizers built with ``wrt=nnx.Param`` leave them alone; take head importance as the
    gradient with ``nnx.grad(loss, argnums=nnx.DiffState(0, HeadGate))``."""


class MultiHeadAttention(nnx.Module):
    """Multi-head, grouped-query (``num_kv_heads < num_heads``) and cross attention, with
    ``flax.nnx.MultiHeadAttention``'s signature, defaults and call forms: code written for
    Flax's module runs unchanged and gains attnjax's scores, kernels and modifiers.

    ``q = W_Q x_q``, ``k = W_K x_k``, ``v = W_V x_v`` split into heads (``[..., T, N, H]``,
    ``[..., S, K, H]``, ``H = qkv_features // num_heads``, any leading batch dimensions);
    ``normalize_qk`` applies a LayerNorm over ``H`` (scale only, shared by heads, as in
    ViT-22B and Flax) to q and k, then ``rope`` rotates them; the ``score`` module (a name of
    :data:`attnjax.nn.scores.SCORE_MODULES`, configured by ``score_options``) gives the logits;
    the heads' outputs (each multiplied by its :class:`HeadGate` once :func:`add_head_gates`
    gave the module gates) go through ``W_O``. The projections take Flax's arguments
    (``kernel_init``: LeCun normal by default, as Flax's; ``bias_init``; the ``*_init``,
    ``*promote_dtype``, ``*dot_general*`` and ``*_metadata`` arguments; ``precision``);
    attention itself computes in float32.

    ``attention_fn`` replaces attnjax's attention with a Flax-style function
    (``flax.nnx.dot_product_attention``'s arguments), as in Flax; attnjax's score, mods and
    kernels then do not apply (setting them too raises).

    ``dropout_rate`` drops attention weights (``broadcast_dropout``: one mask shared by the
    batch and heads, as in Flax), which needs the dense path: an ``implementation`` other than
    ``"xla"``/None raises while dropout is active. Dropout is active unless ``deterministic``
    (the call's, else the attribute's, which ``model.eval()`` and
    ``nnx.view(model, deterministic=True)`` set); its randomness comes from the call's
    ``rngs``, else the module's own stream (kept unless ``keep_rngs=False``).
    ``return_weights=True`` or ``sow_weights`` (the call's or the attribute; sows the weights
    as ``nnx.Intermediate`` ``"attention_weights"`` and their log-sum-exp ``[..., N, T]`` as
    ``"attention_lse"``) runs the call on the dense path. ``score_mod`` is a function of
    :mod:`attnjax.mods` or a module that owns its parameters (:mod:`attnjax.nn.mods`);
    ``mask_mod`` a mask mod function. ``sequence_parallel``
    (:class:`attnjax.sharded.SequenceParallel`) shards the sequence over a mesh axis (ring
    attention); it forms no weights.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        qkv_features: int | None = None,
        out_features: int | None = None,
        num_kv_heads: int | None = None,
        in_kv_features: int | None = None,
        *,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        broadcast_dropout: bool = True,
        dropout_rate: float = 0.0,
        deterministic: bool | None = None,
        precision: Any = None,
        kernel_init: nnx.Initializer = default_kernel_init,
        out_kernel_init: nnx.Initializer | None = None,
        bias_init: nnx.Initializer = ZEROS,
        out_bias_init: nnx.Initializer | None = None,
        use_bias: bool = True,
        attention_fn: Callable[..., Array] | None = None,
        decode: bool | None = None,
        normalize_qk: bool = False,
        qkv_promote_dtype: Callable = promote_dtype,
        out_promote_dtype: Callable = promote_dtype,
        ln_promote_dtype: Callable = promote_dtype,
        qkv_dot_general: Callable | None = None,
        out_dot_general: Callable | None = None,
        qkv_dot_general_cls: Any = None,
        out_dot_general_cls: Any = None,
        rngs: nnx.Rngs,
        keep_rngs: bool = True,
        kernel_metadata: Mapping[str, Any] = NO_METADATA,
        out_kernel_metadata: Mapping[str, Any] = NO_METADATA,
        bias_metadata: Mapping[str, Any] = NO_METADATA,
        out_bias_metadata: Mapping[str, Any] = NO_METADATA,
        query_ln_scale_metadata: Mapping[str, Any] = NO_METADATA,
        key_ln_scale_metadata: Mapping[str, Any] = NO_METADATA,
        score: str = "scaled_dot",
        score_options: Mapping[str, Any] | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        implementation: str | None = None,
        sow_weights: bool = False,
        score_mod: ScoreMod | nnx.Module | None = None,
        mask_mod: MaskMod | None = None,
        sequence_parallel: SequenceParallel | None = None,
    ):
        qkv_features = in_features if qkv_features is None else qkv_features
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or qkv_features % num_heads:
            raise ValueError(
                f"num_heads: expected an int >= 1 dividing qkv_features={qkv_features}, "
                f"got {num_heads}"
            )
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads: expected a divisor of num_heads={num_heads}, got {num_kv_heads}"
            )
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate: expected a value in [0, 1), got {dropout_rate}")
        head_dim = qkv_features // num_heads
        if rope and head_dim % 2:
            raise ValueError(f"rope: needs an even head size, got H={head_dim}")
        if sequence_parallel is not None and implementation is not None:
            raise ValueError(
                f"implementation: sequence_parallel chooses the per-device implementation; got "
                f"{implementation!r}"
            )
        if attention_fn is not None:
            _check_attention_fn(score=score, score_options=score_options, score_mod=score_mod,
                                mask_mod=mask_mod, implementation=implementation,
                                sequence_parallel=sequence_parallel)  # fmt: skip
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.in_features, self.dtype = in_features, dtype
        self.rope, self.rope_base = rope, rope_base
        self.implementation, self.sow_weights = implementation, sow_weights
        self.sequence_parallel, self.attention_fn = sequence_parallel, attention_fn
        self.dropout_rate, self.broadcast_dropout = dropout_rate, broadcast_dropout
        self.deterministic, self.precision = deterministic, precision
        dtypes = {"dtype": dtype, "param_dtype": param_dtype}

        qkv_options = {
            "kernel_init": kernel_init, "bias_init": bias_init,
            "promote_dtype": qkv_promote_dtype, "dot_general": qkv_dot_general,
            "dot_general_cls": qkv_dot_general_cls, "kernel_metadata": kernel_metadata,
            "bias_metadata": bias_metadata,
        }  # fmt: skip
        out_options = {
            "kernel_init": out_kernel_init or kernel_init, "bias_init": out_bias_init or bias_init,
            "promote_dtype": out_promote_dtype, "dot_general": out_dot_general,
            "dot_general_cls": out_dot_general_cls,
            "kernel_metadata": out_kernel_metadata or kernel_metadata,
            "bias_metadata": out_bias_metadata or bias_metadata,
        }  # fmt: skip

        def proj(features, out, axis=-1, options=qkv_options):
            return nnx.LinearGeneral(
                features, out, axis=axis, use_bias=use_bias, precision=precision, rngs=rngs,
                **options, **dtypes,
            )  # fmt: skip

        in_kv_features = in_features if in_kv_features is None else in_kv_features
        self.query = proj(in_features, (num_heads, head_dim))
        self.key = proj(in_kv_features, (num_kv_heads, head_dim))
        self.value = proj(in_kv_features, (num_kv_heads, head_dim))

        def norm(metadata):
            return nnx.LayerNorm(head_dim, use_bias=False, promote_dtype=ln_promote_dtype,
                                 scale_metadata=metadata, rngs=rngs, **dtypes)  # fmt: skip

        self.query_ln, self.key_ln = (
            (norm(query_ln_scale_metadata), norm(key_ln_scale_metadata))
            if normalize_qk
            else (nnx.data(None), nnx.data(None))
        )
        out = in_features if out_features is None else out_features
        self.out = proj((num_heads, head_dim), out, axis=(-2, -1), options=out_options)
        # Flax's order of drawing from rngs, so equal seeds give equal dropout masks.
        self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else None
        self.score = make_score(
            score, num_heads, head_dim, options=score_options, param_dtype=param_dtype, rngs=rngs
        )
        self.gate: HeadGate | None = nnx.data(None)
        self.score_mod, self.mask_mod = score_mod, mask_mod
        self.decode = decode
        self.cached_key: nnx.Cache | None = nnx.data(None)
        self.cached_value: nnx.Cache | None = nnx.data(None)
        self.cache_index: nnx.Cache | None = nnx.data(None)

    def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32) -> None:
        """Flax's: key/value caches for decoding up to ``input_shape[-2]`` positions
        (``input_shape`` is the full-length ``inputs_q`` shape ``[batch..., max_length, D]``,
        any leading batch dimensions, none included); only the ``K`` key/value heads are
        cached under grouped-query attention."""
        shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)
        self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

    def set_view(
        self,
        deterministic: bool | None = None,
        decode: bool | None = None,
        batch_size: int | tuple[int, ...] | None = None,
        max_length: int | None = None,
    ) -> None:
        """Flax's hook for ``nnx.view(model, deterministic=..., decode=...)``: sets the
        attributes; turning decoding on for a module without a cache builds one for
        ``batch_size`` (an int or a tuple of batch dimensions) rows of ``max_length``."""
        if deterministic is not None:
            self.deterministic = deterministic
        if decode is None:
            return
        self.decode = decode
        if decode and self.cache_index is None:
            if batch_size is None or max_length is None:
                raise TypeError(
                    "batch_size, max_length: both are needed to build the cache that "
                    "decode=True reads; pass them to nnx.view or call init_cache first"
                )
            batch = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
            self.init_cache((*batch, max_length, self.in_features), self.dtype or jnp.float32)

    def __call__(
        self,
        inputs_q: Float[Array, "*B T D"],
        inputs_k: Float[Array, "*Bk S Dk"] | None = None,
        inputs_v: Float[Array, "*Bv S Dv"] | None = None,
        *,
        mask: Shaped[Array, "*#B #N #T #S"] | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | Array | None = None,
        sow_weights: bool = False,
        decode: bool | None = None,
        is_causal: bool = False,
        out_sharding: Any = None,
        qkv_sharding: Any = None,
        input_positions: Int[Array, "*#B T"] | None = None,
        positions: Int[Array, "*#B T"] | None = None,
        return_weights: bool = False,
        mod_params: Mapping[str, Any] | None = None,
        block_mask: BlockMask | None = None,
        **attention_kwargs: Any,
    ) -> Float[Array, "*B T Dout"] | tuple[Float[Array, "*B T Dout"], Float[Array, "*B N T S"]]:
        """Flax's call: self-attention (``inputs_k`` None), cross-attention to ``inputs_k``
        (``inputs_v`` None: the same inputs), or separate keys and values, with any leading
        batch dimensions (the same for all three); ``mask`` is True where a query may attend;
        ``out_sharding``/``qkv_sharding`` go to the projections; ``input_positions`` go to
        ``attention_fn`` as in Flax, else they are the RoPE positions (as ``positions``).
        RoPE positions default to ``0..T-1``; keys share the queries' positions in
        self-attention and use ``0..S-1`` otherwise. ``mod_params`` (data for the mods, such
        as document ids) joins the score mod module's own parameters. ``attention_kwargs`` go
        to :func:`attnjax.attention`: ``bias``, ``temperature``,
        ``q_segment_ids``/``kv_segment_ids``, ``query_seq_lengths``/``key_value_seq_lengths``,
        ``local_window_size``,
        ``causal_offset``, ``block_sizes``."""
        if inputs_k is None and inputs_v is not None:
            raise ValueError(
                "inputs_k: cannot be None when inputs_v is given; for the same keys and values "
                "pass inputs_k alone"
            )
        if inputs_q.shape[-1] != self.in_features:
            raise ValueError(
                f"inputs_q: {inputs_q.shape[-1]} features, the module expects {self.in_features}"
            )
        if input_positions is not None and self.attention_fn is None:
            positions = _rope_positions(self.rope, input_positions, positions)
        self_attention = inputs_k is None
        inputs_k = inputs_q if self_attention else inputs_k
        inputs_v = inputs_k if inputs_v is None else inputs_v
        batch = inputs_q.shape[:-2]
        for name, inputs in (("inputs_k", inputs_k), ("inputs_v", inputs_v)):
            if inputs.shape[:-2] != batch:
                raise ValueError(
                    f"{name}: batch dimensions {inputs.shape[:-2]}, inputs_q has {batch}"
                )
        q, k, v = (
            projection(inputs, out_sharding=qkv_sharding).reshape(-1, *inputs.shape[-2:-1], *s)
            for projection, inputs, s in (
                (self.query, inputs_q, (self.num_heads, self.head_dim)),
                (self.key, inputs_k, (self.num_kv_heads, self.head_dim)),
                (self.value, inputs_v, (self.num_kv_heads, self.head_dim)),
            )
        )  # [b, T, N, H], [b, S, K, H]: the batch dimensions folded into one
        if self.query_ln is not None:
            q, k = self.query_ln(q), self.key_ln(k)
        mask = None if mask is None else flatten_batch(mask.astype(bool), batch, 3)
        positions = None if positions is None else flatten_batch(positions, batch, 1)
        attention_kwargs = {
            name: flatten_batch(value, batch, _BATCHED[name])
            if name in _BATCHED and value is not None
            else value
            for name, value in attention_kwargs.items()
        }
        decode = self.decode if decode is None else decode
        if decode:
            index = self._check_cache(q, batch, self_attention, attention_kwargs)
            positions = index + jnp.arange(q.shape[1]) if positions is None else positions
        if self.rope:
            q_pos = default_positions(q.shape[1]) if positions is None else positions
            k_pos = q_pos if self_attention else default_positions(k.shape[1])
            q, k = rope(q, q_pos, base=self.rope_base), rope(k, k_pos, base=self.rope_base)
        q, k, v = (hooks.point(self, n, x, batch) for n, x in zip("qkv", (q, k, v), strict=True))
        if decode:  # attend to the cache: every key so far and these, causally
            k, v = self._cached(k, v, index)
        deterministic = self.deterministic if deterministic is None else deterministic
        dropout = self.dropout_rate > 0 and not deterministic
        sow = sow_weights or self.sow_weights
        if self.attention_fn is not None:
            _check_flax_call(return_weights, mod_params, block_mask, attention_kwargs)
            if decode:
                mask = _cache_visible(mask, index, q.shape[1], k.shape[1])
            key = _dropout_key(self.rngs if rngs is None else rngs) if dropout else None
            out = self.attention_fn(
                *(unflatten_batch(x, batch) for x in (q, k, v)),
                mask=None if mask is None else unflatten_batch(mask, batch),
                dropout_rng=key, dropout_rate=self.dropout_rate,
                broadcast_dropout=self.broadcast_dropout, deterministic=not dropout,
                dtype=self.dtype, precision=self.precision, module=self if sow else None,
                is_causal=is_causal and not decode,  # the cache's mask is causal already
                **({} if input_positions is None else {"input_positions": input_positions}),
            )  # fmt: skip
            return hooks.project(self, hooks.point(self, "z", self._gated(out)), out_sharding)
        if decode:
            is_causal, attention_kwargs = True, {**attention_kwargs, "causal_offset": index}
        if dropout and self.implementation not in (None, DENSE):
            raise ValueError(
                f"dropout_rate: attention dropout runs on the dense path only; "
                f"implementation={self.implementation!r} cannot apply it. Use implementation="
                f"None or {DENSE!r}, or call with deterministic=True"
            )
        dense = return_weights or sow or dropout
        score_mod, own_params = split_mod(self.score_mod)
        implementation = DENSE if dense else self.implementation
        common = {
            "mask": mask,
            "is_causal": is_causal,
            "score": self.score.name,
            "score_params": self.score(),
            "score_mod": score_mod,
            "mask_mod": self.mask_mod,
            "mod_params": {**own_params, **(mod_params or {})},
            **attention_kwargs,
        }
        patterns = hooks.patterns(self)  # None unless a hook reads or replaces logits/pattern
        if self.sequence_parallel is not None:
            _check_sequence_parallel(dense=dense, block_mask=block_mask)
            out, weights, lse = self.sequence_parallel(q, k, v, **common), None, None
        elif patterns is not None:
            out, weights, lse = patterns.attend(
                q, k, v, batch, implementation, dense, block_mask, common
            )
        else:
            result = attention(
                q,
                k,
                v,
                return_weights=dense,
                return_lse=dense,
                implementation=implementation,
                block_mask=block_mask,
                **common,
            )
            out, weights, lse = result if dense else (result, None, None)
        if sow:
            self.sow(nnx.Intermediate, "attention_weights", unflatten_batch(weights, batch))
            self.sow(nnx.Intermediate, "attention_lse", unflatten_batch(lse, batch))
        if dropout:
            key = _dropout_key(self.rngs if rngs is None else rngs)
            dropped = dropout_weights(weights, key, self.dropout_rate, self.broadcast_dropout)
            out = weighted_sum(dropped, v).astype(out.dtype)
        z = hooks.point(self, "z", self._gated(unflatten_batch(out, batch)))
        out = hooks.project(self, z, out_sharding)
        return (out, unflatten_batch(weights, batch)) if return_weights else out

    def _gated(self, out: Float[Array, "*B T N H"]) -> Float[Array, "*B T N H"]:
        """Each head's output times its gate, once the module has gates."""
        if self.gate is None:
            return out
        gate = jax.lax.broadcast_to_rank(self.gate[...][:, None], out.ndim)  # [..., N, 1]
        return out * gate.astype(out.dtype)

    def _check_cache(
        self, q: Array, batch: tuple[int, ...], self_attention: bool, attention_kwargs: dict
    ) -> Array:
        """The cache's next position; errors for calls decoding cannot serve."""
        if self.cache_index is None:
            raise ValueError("decode: the cache is not initialized; call init_cache first")
        if not self_attention or self.sequence_parallel is not None:
            raise ValueError("decode: caches self-attention on one device only")
        for name in ("causal_offset", *_PACKING):
            if attention_kwargs.get(name) is not None:
                raise ValueError(
                    f"{name}: not taken while decoding (the cache sets the causal offset; "
                    "packed or padded rows are not decoded)"
                )
        *cache_batch, length, _, _ = self.cached_key.shape
        if tuple(cache_batch) != batch:
            raise ValueError(
                f"inputs_q: batch dimensions {batch}, the cache was built for "
                f"{tuple(cache_batch)} (init_cache takes the inputs' full shape)"
            )
        if q.shape[1] > length:
            raise ValueError(f"inputs_q: {q.shape[1]} positions exceed the cache's {length}")
        return self.cache_index[...]

    def _cached(
        self, k: Float[Array, "b S K H"], v: Float[Array, "b S K H"], index: Array
    ) -> tuple[Float[Array, "b L K H"], Float[Array, "b L K H"]]:
        """Writes ``k``, ``v`` at ``index`` (positions past the cache's end are clamped by
        ``dynamic_update_slice``: size the cache for the whole sequence) and returns the
        whole caches, their batch dimensions folded into one."""
        zero = jnp.zeros_like(index)  # one index dtype, also under jax_enable_x64
        start = (zero, index, zero, zero)
        caches = []
        for cache, new in ((self.cached_key, k), (self.cached_value, v)):
            shape = cache.shape
            folded = cache[...].reshape(-1, *shape[-3:])
            folded = jax.lax.dynamic_update_slice(folded, new.astype(folded.dtype), start)
            cache[...] = folded.reshape(shape)
            caches.append(folded)
        self.cache_index[...] = index + k.shape[1]
        return caches[0], caches[1]


def add_head_gates(model: nnx.Module) -> nnx.Module:
    """Gives every :class:`MultiHeadAttention` of ``model`` that has none a :class:`HeadGate`
    of ones ``[N]`` (in place; the outputs are unchanged until a gate changes) and returns
    ``model``: the handle of head pruning and head-importance gradients."""
    for _, layer in nnx.iter_modules(model):
        if isinstance(layer, MultiHeadAttention) and layer.gate is None:
            dtype = layer.query.kernel[...].dtype
            layer.gate = HeadGate(jnp.ones((layer.num_heads,), dtype))
    return model


def _rope_positions(rope: bool, input_positions: Array, positions: Array | None) -> Array:
    """Flax's ``input_positions`` as attnjax's RoPE ``positions``."""
    if not rope:
        raise ValueError(
            "input_positions: Flax passes them to attention_fn; without attention_fn they are "
            "RoPE positions, and this module has rope=False"
        )
    if positions is not None:
        raise ValueError("input_positions, positions: the same positions; pass one")
    return input_positions


def _check_attention_fn(**attnjax_options: Any) -> None:
    """``attention_fn`` replaces attnjax's attention: its options cannot apply."""
    defaults = {"score": "scaled_dot"}
    for name, value in attnjax_options.items():
        if value is not None and value != defaults.get(name):
            raise ValueError(
                f"{name}: does not apply with attention_fn, which replaces attnjax's attention "
                f"(got {name}={value!r}); leave attention_fn unset to use it"
            )


def _check_flax_call(
    return_weights: bool, mod_params: Any, block_mask: Any, attention_kwargs: dict
) -> None:
    """With ``attention_fn`` the call takes Flax's arguments only."""
    extras = {"return_weights": return_weights, "mod_params": mod_params,
              "block_mask": block_mask, **attention_kwargs}  # fmt: skip
    given = sorted(name for name, value in extras.items() if value not in (None, False))
    if given:
        raise ValueError(
            f"{', '.join(given)}: attnjax's call arguments do not apply with attention_fn, "
            "which takes Flax's arguments only"
        )


def _cache_visible(
    mask: Array | None, index: Array, length: int, cache_length: int
) -> Bool[Array, "#b 1 T L"]:
    """``mask`` and the decoding cache's causal visibility: query ``t`` (at ``index + t``)
    sees cached keys ``0 .. index + t``, as Flax's decoding mask."""
    rows = index + jnp.arange(length)[:, None]
    visible = (jnp.arange(cache_length)[None, :] <= rows)[None, None]
    return visible if mask is None else mask & visible


def dropout_weights(
    weights: Float[Array, "*B N T S"], key: Array, rate: float, broadcast: bool
) -> Float[Array, "*B N T S"]:
    """Flax's attention dropout: weights kept with probability ``1 - rate`` and rescaled;
    ``broadcast``: one ``[T, S]`` mask for every batch entry and head."""
    shape = (1,) * (weights.ndim - 2) + weights.shape[-2:] if broadcast else weights.shape
    keep = jax.random.bernoulli(key, 1.0 - rate, shape)
    return jnp.where(keep, weights / (1.0 - rate), 0.0).astype(weights.dtype)


def _dropout_key(rngs: nnx.Rngs | nnx.RngStream | Array | None) -> Array:
    if rngs is None:
        raise ValueError(
            "rngs: active dropout needs randomness; pass rngs= to the call (an nnx.Rngs or a "
            "key) or build the module with keep_rngs=True"
        )
    if isinstance(rngs, nnx.Rngs):
        return rngs.dropout()
    return rngs() if isinstance(rngs, nnx.RngStream) else rngs


def _check_sequence_parallel(dense: bool, block_mask: BlockMask | None) -> None:
    """Sequence-parallel attention forms no weights and builds its block masks itself."""
    if dense:
        raise ValueError(
            "sequence_parallel: forms no attention weights; return_weights, sow_weights and "
            "active dropout need the dense path (call with deterministic=True)"
        )
    if block_mask is not None:
        raise ValueError("block_mask: not taken with sequence_parallel (built per block)")


def capture_attention(
    model: nnx.Module, *args: Any, record: bool = True, **kwargs: Any
) -> tuple[Any, list[Float[Array, "B N T S"]], list[Float[Array, "B N T"]]]:
    """``(model(*args, **kwargs), weights, lse)``: with ``record``, every
    :class:`MultiHeadAttention` of ``model`` sows its attention weights and their
    log-sum-exp during this call (one array per layer, in ``nnx.state`` order; layers then run
    on the dense path); each layer's ``sow_weights`` switch is restored afterwards. Without
    ``record``, only the layers whose switch is on are captured."""
    layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, MultiHeadAttention)]
    switches = [layer.sow_weights for layer in layers]
    for layer in layers:
        layer.sow_weights = layer.sow_weights or record
    try:
        out, sown = nnx.capture(model, nnx.Intermediate)(*args, **kwargs)
    finally:
        for layer, switch in zip(layers, switches, strict=True):
            layer.sow_weights = switch
    weights, lse = (
        jax.tree.leaves(nnx.filter_state(sown, nnx.PathContains(name)))
        for name in ("attention_weights", "attention_lse")
    )
    return out, weights, lse


def weighted_sum(
    weights: Float[Array, "B N T S"], value: Float[Array, "B S K H"]
) -> Float[Array, "B T N H"]:
    """``Σ_s weights[b, n, t, s] · value[b, s, n // (N/K), :]`` in float32."""
    b, n, t, s = weights.shape
    k, h = value.shape[2], value.shape[3]
    grouped = weights.reshape(b, k, n // k, t, s)
    out = jnp.einsum("bkgts,bskh->btkgh", grouped, value.astype(jnp.float32))
    return out.reshape(b, t, n, h)
