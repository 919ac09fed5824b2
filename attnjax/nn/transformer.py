"""Pre-LN transformer blocks and stacks: ``x + MHA(LN(x))`` [+ ``x + CrossMHA(LN(x), memory)``]
[+ ``x + MLP(LN(x))``], with the MLP and the norms optional."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from attnjax.nn import hooks
from attnjax.nn.attention import MultiHeadAttention


class Mlp(nnx.Module):
    """``W₂ gelu(W₁ x)`` with hidden size ``ratio · D``."""

    def __init__(self, dim: int, ratio: int = 4, *, dtype=None, param_dtype=jnp.float32, rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.up = nnx.Linear(dim, ratio * dim, **kw)
        self.down = nnx.Linear(ratio * dim, dim, **kw)

    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """One pre-LN block of width ``D``. ``mlp=False`` drops the MLP, ``norms=False`` the
    LayerNorms (then a one-layer block is exactly ``Y = X + MHSA(X)``); ``cross_attention``
    adds a cross-attention sublayer over ``memory``. ``attention_options`` go to every
    :class:`MultiHeadAttention` (score, score_options, num_kv_heads, qk_norm, rope, ...)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp: bool = True,
        mlp_ratio: int = 4,
        norms: bool = True,
        cross_attention: bool = False,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
        **attention_options: Any,
    ):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}

        def norm():
            return nnx.LayerNorm(dim, **kw) if norms else None

        self.attention = MultiHeadAttention(num_heads, dim, **attention_options, **kw)
        self.attention_norm = norm()
        self.cross = (
            MultiHeadAttention(num_heads, dim, **attention_options, **kw)
            if cross_attention
            else None
        )
        self.cross_norm = norm() if cross_attention else None
        self.mlp = Mlp(dim, mlp_ratio, **kw) if mlp else None
        self.mlp_norm = norm() if mlp else None

    def __call__(
        self,
        x: Float[Array, "B T D"],
        memory: Float[Array, "B S D"] | None = None,
        *,
        mask: Bool[Array, "#B #N #T #T"] | None = None,
        memory_mask: Bool[Array, "#B #N #T #S"] | None = None,
        is_causal: bool = False,
        positions: Int[Array, "*#B T"] | None = None,
        segment_ids: Int[Array, "B T"] | None = None,
        lengths: Int[Array, " B"] | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
        decode: bool | None = None,
    ) -> Float[Array, "B T D"]:
        """Self-attention over ``x``; cross-attention to ``memory`` if the block has it.
        ``decode``: self-attention reads and extends its key/value cache (``init_cache``).
        Packed rows: ``segment_ids`` (a query sees keys of its own segment) with ``positions``
        restarting per segment; padded rows: ``lengths`` (valid positions per row). Both reach
        attention as structured masks, so the tiled paths skip the tiles they empty.
        ``deterministic`` and ``rngs`` (a key is split per sublayer) go to attention dropout.
        Hook points (:mod:`attnjax.nn.hooks`): ``resid_pre``, ``mlp_out``, ``resid_post``."""
        x = hooks.point(self, "resid_pre", x)
        x = x + self.attention(
            _apply(self.attention_norm, x),
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            deterministic=deterministic,
            rngs=layer_rngs(rngs, 0),
            decode=decode,
            **packing(segment_ids, lengths),
        )
        if self.cross is not None:
            if memory is None:
                raise ValueError("memory: a block with cross_attention needs memory [B, S, D]")
            x = x + self.cross(
                _apply(self.cross_norm, x),
                memory,
                mask=memory_mask,
                deterministic=deterministic,
                rngs=layer_rngs(rngs, 1),
            )
        if self.mlp is not None:
            x = x + hooks.point(self, "mlp_out", self.mlp(_apply(self.mlp_norm, x)))
        return hooks.point(self, "resid_post", x)


def packing(segment_ids: Array | None, lengths: Array | None) -> dict[str, Array]:
    """Self-attention's structured masks for packed (``segment_ids``) and padded
    (``lengths``) rows, as :func:`attnjax.attention` keywords."""
    kwargs = {}
    if segment_ids is not None:
        kwargs |= {"q_segment_ids": segment_ids, "kv_segment_ids": segment_ids}
    if lengths is not None:
        kwargs |= {"query_seq_lengths": lengths, "key_value_seq_lengths": lengths}
    return kwargs


def _apply(norm: nnx.LayerNorm | None, x: Array) -> Array:
    return x if norm is None else norm(x)


def layer_rngs(rngs: nnx.Rngs | Array | None, index: int) -> nnx.Rngs | Array | None:
    """A key of its own for sublayer ``index`` when ``rngs`` is a key (the same key in two
    layers would draw the same dropout mask); an ``nnx.Rngs`` or None as it is. A model with
    both an :class:`Encoder` and a :class:`Decoder` passes each stack a key of its own."""
    if isinstance(rngs, jax.Array):
        return jax.random.fold_in(rngs, index)
    return rngs


class Encoder(nnx.Module):
    """``num_layers`` self-attention :class:`Block` s (causal with ``is_causal``: a decoder-only
    language model), then a final LayerNorm if ``norms``."""

    def __init__(self, num_layers: int, dim: int, num_heads: int, *, rngs, **block_options):
        self.blocks = nnx.List(
            [Block(dim, num_heads, rngs=rngs, **block_options) for _ in range(num_layers)]
        )
        self.norm = _final_norm(dim, block_options, rngs)

    def __call__(
        self,
        x: Float[Array, "B T D"],
        *,
        mask: Bool[Array, "#B #N #T #T"] | None = None,
        is_causal: bool = False,
        positions: Int[Array, "*#B T"] | None = None,
        segment_ids: Int[Array, "B T"] | None = None,
        lengths: Int[Array, " B"] | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
        decode: bool | None = None,
    ) -> Float[Array, "B T D"]:
        """The blocks in turn; arguments as :class:`Block`'s."""
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                mask=mask,
                is_causal=is_causal,
                positions=positions,
                segment_ids=segment_ids,
                lengths=lengths,
                deterministic=deterministic,
                rngs=layer_rngs(rngs, i),
                decode=decode,
            )
        return _apply(self.norm, x)


class Decoder(nnx.Module):
    """``num_layers`` blocks of causal self-attention and cross-attention to ``memory`` (the
    encoder's output), then a final LayerNorm if ``norms``."""

    def __init__(self, num_layers: int, dim: int, num_heads: int, *, rngs, **block_options):
        self.blocks = nnx.List(
            [
                Block(dim, num_heads, cross_attention=True, rngs=rngs, **block_options)
                for _ in range(num_layers)
            ]
        )
        self.norm = _final_norm(dim, block_options, rngs)

    def __call__(
        self,
        x: Float[Array, "B T D"],
        memory: Float[Array, "B S D"],
        *,
        memory_mask: Bool[Array, "#B #N #T #S"] | None = None,
        positions: Int[Array, "*#B T"] | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
    ) -> Float[Array, "B T D"]:
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                memory,
                memory_mask=memory_mask,
                is_causal=True,
                positions=positions,
                deterministic=deterministic,
                rngs=layer_rngs(rngs, i),
            )
        return _apply(self.norm, x)


def _final_norm(dim: int, block_options: dict[str, Any], rngs: nnx.Rngs) -> nnx.LayerNorm | None:
    if not block_options.get("norms", True):
        return None
    dtypes = {k: block_options[k] for k in ("dtype", "param_dtype") if k in block_options}
    return nnx.LayerNorm(dim, rngs=rngs, **dtypes)
