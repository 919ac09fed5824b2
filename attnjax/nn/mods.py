"""Score and mask mods for :class:`~attnjax.nn.MultiHeadAttention`, learnable ones as modules.

A mod module owns its parameters and exposes ``score_mod`` (a pure function of
:mod:`attnjax.mods`) and ``mod_params()`` (the pytree that function reads), so gradients reach
its ``nnx.Param`` through every implementation. :func:`make_mod` builds a gallery entry by name
for :class:`~attnjax.nn.ModelConfig`.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from attnjax import mods


class RelativePositionBias(nnx.Module):
    """T5's learnable relative-position bias: a table ``[N, num_buckets]`` (zeros at init)."""

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        *,
        bidirectional: bool = True,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs  # zeros, as T5
        self.table = nnx.Param(jnp.zeros((num_heads, num_buckets), param_dtype))
        self.score_mod = mods.relative_position_bias(
            num_buckets, max_distance, bidirectional=bidirectional, param="relative_bias"
        )

    def mod_params(self) -> dict[str, Any]:
        return {"relative_bias": self.table[...]}


class ALiBi(nnx.Module):
    """ALiBi's distance penalty with one slope per head, starting at the paper's slopes;
    ``learnable=False`` keeps them fixed (a constant, not a parameter)."""

    def __init__(
        self,
        num_heads: int,
        *,
        learnable: bool = False,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs
        slopes = jnp.asarray(mods.alibi_slopes(num_heads), param_dtype)
        self.slopes = nnx.Param(slopes) if learnable else nnx.Variable(slopes)
        self.score_mod = mods.alibi(param="alibi_slopes")

    def mod_params(self) -> dict[str, Any]:
        return {"alibi_slopes": self.slopes[...]}


# name -> (num_heads, rngs, **options) -> a score mod function or module
SCORE_MODS: dict[str, Callable[..., Any]] = {
    "alibi": lambda num_heads, rngs: ALiBi(num_heads, rngs=rngs),
    "learnable_alibi": lambda num_heads, rngs: ALiBi(num_heads, learnable=True, rngs=rngs),
    "relative_position_bias": lambda num_heads, rngs, **o: RelativePositionBias(
        num_heads, rngs=rngs, **o
    ),
    "softcap": lambda num_heads, rngs, cap: mods.softcap(cap),
}
# name -> (**options) -> a mask mod; per-batch data (prefix lengths, document ids) comes as
# the call's mod_params
MASK_MODS: dict[str, Callable[..., Any]] = {
    "causal": mods.causal,
    "sliding_window": lambda size: mods.sliding_window(size, 0),
    "dilated": lambda size: mods.dilated(size),
    "prefix_lm": mods.prefix_lm,
    "document": mods.document,
}


def make_mod(
    kind: str, name: str | None, options: Mapping[str, Any] | None, num_heads: int, rngs
) -> Any:
    """The gallery entry ``name`` of ``SCORE_MODS`` or ``MASK_MODS`` (``kind``), or ``None``."""
    if name is None:
        return None
    registry = SCORE_MODS if kind == "score_mod" else MASK_MODS
    if name not in registry:
        raise ValueError(f"{kind}: expected one of {sorted(registry)} or None, got {name!r}")
    options = dict(options or {})
    if kind == "score_mod":
        return registry[name](num_heads, rngs, **options)
    return registry[name](**options)


def split_mod(mod: Any) -> tuple[Callable | None, dict[str, Any]]:
    """``(function, parameters)`` of a mod: a module's ``score_mod`` and ``mod_params()``, or
    a plain function with no parameters of its own."""
    if isinstance(mod, nnx.Module):
        return mod.score_mod, mod.mod_params()
    return mod, {}
