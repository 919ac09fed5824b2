"""``MultiHeadAttention``: projections, optional QK-norm and RoPE, a score module, per-head
gates, all on top of :func:`attnjax.attention`."""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from attnjax.attention import attention
from attnjax.call import MaskMod, ScoreMod
from attnjax.masks import BlockMask
from attnjax.nn.mods import split_mod
from attnjax.nn.positional import default_positions, rope
from attnjax.nn.scores import make_score
from attnjax.sharded import SequenceParallel

DENSE = "xla"  # the implementation that materializes the weights
XAVIER = nnx.initializers.xavier_uniform()


class HeadGate(nnx.Variable):
    """Per-head output multipliers ``[N]``. Not an ``nnx.Param``: optimizers built with
    ``wrt=nnx.Param`` leave them alone; take head importance as the gradient with
    ``nnx.grad(loss, argnums=nnx.DiffState(0, HeadGate))``."""


class MultiHeadAttention(nnx.Module):
    """Multi-head, grouped-query (``num_kv_heads < num_heads``) and cross attention.

    ``q = W_Q x``, ``k = W_K x_kv``, ``v = W_V x_kv`` split into heads (``[B, T, N, H]``,
    ``[B, S, K, H]``, ``H = qkv_features // num_heads``); ``qk_norm`` applies a LayerNorm over
    ``H`` (scale only, shared by heads, as in ViT-22B) to q and k, then ``rope`` rotates them;
    the ``score`` module (a name of :data:`attnjax.nn.scores.SCORE_MODULES`, configured by
    ``score_options``) gives the logits; each head's output is multiplied by its
    :class:`HeadGate` (ones) before ``W_O``. Kernels use ``kernel_init``, by default
    Xavier/Glorot uniform over the flattened shapes (``fan_in = in_features``,
    ``fan_out = N·H`` for ``W_Q``; ``fan_in = N·H`` for ``W_O``); biases are zero.

    ``dropout_rate`` drops attention weights, which needs the dense path: an
    ``implementation`` other than ``"xla"``/None raises while dropout is active (not
    deterministic). ``return_weights=True`` (or the attribute ``sow_weights``, which sows the
    weights as ``nnx.Intermediate`` ``"attention_weights"`` and their log-sum-exp ``[B, N, T]``
    as ``"attention_lse"``) runs the call on the dense path, so output and weights come from
    the same computation. ``score_mod`` is a function of :mod:`attnjax.mods` or a module that
    owns its parameters (:mod:`attnjax.nn.mods`); ``mask_mod`` a mask mod function.
    ``sequence_parallel`` (:class:`attnjax.sharded.SequenceParallel`) shards the sequence over
    a mesh axis (ring attention); it takes no dense masks and forms no weights.
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        *,
        in_kv_features: int | None = None,
        num_kv_heads: int | None = None,
        qkv_features: int | None = None,
        out_features: int | None = None,
        score: str = "scaled_dot",
        qk_norm: bool = False,
        rope: bool = False,
        dropout_rate: float = 0.0,
        use_bias: bool = True,
        implementation: str | None = None,
        score_options: Mapping[str, Any] | None = None,
        rope_base: float = 10000.0,
        sow_weights: bool = False,
        kernel_init: nnx.Initializer = XAVIER,
        score_mod: ScoreMod | nnx.Module | None = None,
        mask_mod: MaskMod | None = None,
        sequence_parallel: SequenceParallel | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
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
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope, self.rope_base = rope, rope_base
        self.implementation, self.sow_weights = implementation, sow_weights
        if sequence_parallel is not None and implementation is not None:
            raise ValueError(
                f"implementation: sequence_parallel chooses the per-device implementation; got "
                f"{implementation!r}"
            )
        self.sequence_parallel = sequence_parallel

        def proj(features, heads):
            return nnx.LinearGeneral(
                features,
                (heads, head_dim),
                use_bias=use_bias,
                kernel_init=kernel_init,
                dtype=dtype,
                param_dtype=param_dtype,
                rngs=rngs,
            )

        in_kv_features = in_features if in_kv_features is None else in_kv_features
        self.query = proj(in_features, num_heads)
        self.key = proj(in_kv_features, num_kv_heads)
        self.value = proj(in_kv_features, num_kv_heads)
        self.out = nnx.LinearGeneral(
            (num_heads, head_dim),
            in_features if out_features is None else out_features,
            axis=(-2, -1),
            use_bias=use_bias,
            kernel_init=kernel_init,
            dtype=dtype,
            param_dtype=param_dtype,
            rngs=rngs,
        )

        def norm():
            return nnx.LayerNorm(
                head_dim, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs
            )

        self.query_norm, self.key_norm = (norm(), norm()) if qk_norm else (None, None)
        self.score = make_score(
            score, num_heads, head_dim, options=score_options, param_dtype=param_dtype, rngs=rngs
        )
        self.gate = HeadGate(jnp.ones((num_heads,), param_dtype))
        self.score_mod, self.mask_mod = score_mod, mask_mod
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs) if dropout_rate > 0 else None

    def __call__(
        self,
        inputs_q: Float[Array, "B T D"],
        inputs_kv: Float[Array, "B S Dkv"] | None = None,
        *,
        mask: Bool[Array, "#B #N #T #S"] | None = None,
        is_causal: bool = False,
        positions: Int[Array, "*#B T"] | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
        return_weights: bool = False,
        mod_params: Mapping[str, Any] | None = None,
        block_mask: BlockMask | None = None,
    ) -> Float[Array, "B T Dout"] | tuple[Float[Array, "B T Dout"], Float[Array, "B N T S"]]:
        """Self-attention (``inputs_kv`` None) or cross-attention; ``mask`` is True where a
        query may attend. RoPE positions default to ``0..T-1``; keys share the queries'
        positions in self-attention and use ``0..S-1`` in cross-attention. Dropout draws its
        mask from ``rngs`` (an ``nnx.Rngs`` or a key) when given, else from the module's own
        stream. ``mod_params`` (data for the mask and score mods, such as document ids) joins
        the score mod module's own parameters; ``block_mask`` is passed to attention."""
        self_attention = inputs_kv is None
        inputs_kv = inputs_q if self_attention else inputs_kv
        q, k, v = self.query(inputs_q), self.key(inputs_kv), self.value(inputs_kv)
        if self.query_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        if self.rope:
            q_pos = default_positions(q.shape[1]) if positions is None else positions
            k_pos = q_pos if self_attention else default_positions(k.shape[1])
            q, k = rope(q, q_pos, base=self.rope_base), rope(k, k_pos, base=self.rope_base)

        dropout = self.dropout is not None and not (
            self.dropout.deterministic if deterministic is None else deterministic
        )
        if dropout and self.implementation not in (None, DENSE):
            raise ValueError(
                f"dropout_rate: attention dropout runs on the dense path only; "
                f"implementation={self.implementation!r} cannot apply it. Use implementation="
                f"None or {DENSE!r}, or call with deterministic=True"
            )
        dense = return_weights or self.sow_weights or dropout
        score_mod, own_params = split_mod(self.score_mod)
        common = {
            "is_causal": is_causal,
            "score": self.score.name,
            "score_params": self.score(),
            "score_mod": score_mod,
            "mask_mod": self.mask_mod,
            "mod_params": {**own_params, **(mod_params or {})},
        }
        if self.sequence_parallel is not None:
            _check_sequence_parallel(dense=dense, mask=mask, block_mask=block_mask)
            out, weights, lse = self.sequence_parallel(q, k, v, **common), None, None
        else:
            result = attention(
                q,
                k,
                v,
                mask=mask,
                return_weights=dense,
                return_residual=dense,
                implementation=DENSE if dense else self.implementation,
                block_mask=block_mask,
                **common,
            )
            out, weights, lse = result if dense else (result, None, None)
        if dropout:
            out = _weighted_sum(self.dropout(weights, deterministic=False, rngs=rngs), v).astype(
                out.dtype
            )
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)
            self.sow(nnx.Intermediate, "attention_lse", lse)
        out = self.out(out * self.gate[...][:, None].astype(out.dtype))
        return (out, weights) if return_weights else out


def _check_sequence_parallel(**refused: Any) -> None:
    """Sequence-parallel attention forms no weights and takes no dense masks."""
    if refused["dense"]:
        raise ValueError(
            "sequence_parallel: forms no attention weights; return_weights, sow_weights and "
            "active dropout need the dense path (call with deterministic=True)"
        )
    for name in ("mask", "block_mask"):
        if refused[name] is not None:
            raise ValueError(f"{name}: not taken with sequence_parallel; use is_causal or mods")


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


def _weighted_sum(
    weights: Float[Array, "B N T S"], value: Float[Array, "B S K H"]
) -> Float[Array, "B T N H"]:
    """``Σ_s weights[b, n, t, s] · value[b, s, n // (N/K), :]`` in float32."""
    b, n, t, s = weights.shape
    k, h = value.shape[2], value.shape[3]
    grouped = weights.reshape(b, k, n // k, t, s)
    out = jnp.einsum("bkgts,bskh->btkgh", grouped, value.astype(jnp.float32))
    return out.reshape(b, t, n, h)
