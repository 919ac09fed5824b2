"""Score modules: per-head parameters of the scoring functions in :mod:`attnjax.scores`.

Each module has a ``name`` (a key of :data:`attnjax.scores.SCORES`) and returns its
``score_params`` (arrays with a leading head dim ``[N, ...]``) when called, ready for
``attnjax.attention(..., score=module.name, score_params=module())``.
"""

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from attnjax.scores import SCORES


class Score(nnx.Module):
    """Base class: a score without parameters; subclasses set ``name`` and ``__call__``."""

    name = "dot"

    def __call__(self) -> dict[str, Array]:
        return {}

    def logits(
        self, q: Float[Array, "B N T H"], k: Float[Array, "B N S H"]
    ) -> Float[Array, "B N T S"]:
        """The raw logits (before bias, temperature and mask), as ``attention`` computes them."""
        params = self()
        if self.name == "scaled_dot" and "scale" not in params:
            params["scale"] = 1.0 / math.sqrt(q.shape[-1])
        return SCORES[self.name].fn(q, k, **params)


class Dot(Score):
    """``q · k``, unscaled."""

    def __init__(self, num_heads: int, head_dim: int, *, param_dtype=jnp.float32, rngs=None):
        del num_heads, head_dim, param_dtype, rngs


class ScaledDot(Score):
    """``γ · q · k`` with ``γ = 1/sqrt(H)``; ``learnable_scale`` makes ``γ = 1/τ`` a per-head
    parameter ``scale [N]`` initialized to ``init_scale`` (default ``1/sqrt(H)``)."""

    name = "scaled_dot"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        learnable_scale: bool = False,
        init_scale: float | None = None,
        param_dtype=jnp.float32,
        rngs=None,
    ):
        del rngs
        if init_scale is not None and not learnable_scale:
            raise ValueError("init_scale: applies with learnable_scale=True only")
        init = 1.0 / math.sqrt(head_dim) if init_scale is None else init_scale
        self.scale = (
            nnx.Param(jnp.full((num_heads,), init, param_dtype)) if learnable_scale else None
        )

    def __call__(self) -> dict[str, Array]:
        return {} if self.scale is None else {"scale": self.scale[...]}


class Bilinear(Score):
    """``qᵀ W k`` with ``w [N, H, H]`` ~ normal(std ``1/H``): the logit variance at init equals
    scaled dot's."""

    name = "bilinear"

    def __init__(self, num_heads: int, head_dim: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        init = nnx.initializers.normal(1.0 / head_dim)
        self.w = nnx.Param(init(rngs.params(), (num_heads, head_dim, head_dim), param_dtype))

    def __call__(self) -> dict[str, Array]:
        return {"w": self.w[...]}


class Additive(Score):
    """``vᵀ act(W_qᵀ q + W_kᵀ k + b)`` with ``act`` tanh or relu and hidden size ``A``.

    ``w_q, w_k [N, H, A]`` ~ normal(std ``1/sqrt(H)``), ``v [N, A]`` ~ normal(std
    ``1/sqrt(A)``), ``b [N, A]`` filled with ``bias_init`` (default 0; absent with
    ``use_bias=False``). ``hidden`` defaults to ``H``.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        hidden: int | None = None,
        activation: str = "tanh",
        use_bias: bool = True,
        bias_init: float = 0.0,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        if bias_init and not use_bias:
            raise ValueError(f"bias_init: needs use_bias=True, got bias_init={bias_init}")
        if activation not in ("tanh", "relu"):
            raise ValueError(f"activation: expected 'tanh' or 'relu', got {activation!r}")
        hidden = head_dim if hidden is None else hidden
        if hidden < 1:
            raise ValueError(f"hidden: expected an int >= 1, got {hidden}")
        self.name = "additive" if activation == "tanh" else "additive_relu"
        normal = jax.nn.initializers.normal
        shape = (num_heads, head_dim, hidden)
        self.w_q = nnx.Param(normal(head_dim**-0.5)(rngs.params(), shape, param_dtype))
        self.w_k = nnx.Param(normal(head_dim**-0.5)(rngs.params(), shape, param_dtype))
        self.v = nnx.Param(normal(hidden**-0.5)(rngs.params(), (num_heads, hidden), param_dtype))
        self.b = (
            nnx.Param(jnp.full((num_heads, hidden), bias_init, param_dtype)) if use_bias else None
        )

    def __call__(self) -> dict[str, Array]:
        params = {"w_q": self.w_q[...], "w_k": self.w_k[...], "v": self.v[...]}
        return params if self.b is None else {**params, "b": self.b[...]}


def qknorm_scale(length: int) -> float:
    """QKNorm's initial scale ``log2(L² - L)`` (Henry et al., 2020) for sequences of length L:
    large enough that one key can take almost all the weight."""
    if length < 2:
        raise ValueError(f"length: expected an int >= 2, got {length}")
    return math.log2(length * length - length)


class Cosine(Score):
    """``scale · cos(q, k)`` with a per-head ``scale [N]``, initialized to ``init_scale`` or
    else :func:`qknorm_scale` of ``length`` (a bounded logit would otherwise cap the largest
    attention weight: see :func:`attnjax.analysis.cosine_weight_bound`); learnable, or held
    fixed at ``init_scale`` with ``learnable=False``."""

    name = "cosine"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        length: int = 128,
        init_scale: float | None = None,
        learnable: bool = True,
        param_dtype=jnp.float32,
        rngs=None,
    ):
        del head_dim, rngs
        init = qknorm_scale(length) if init_scale is None else init_scale
        full = jnp.full((num_heads,), init, param_dtype)
        self.scale = nnx.Param(full) if learnable else nnx.Variable(full)

    def __call__(self) -> dict[str, Array]:
        return {"scale": self.scale[...]}


SCORE_MODULES: dict[str, type[Score] | functools.partial] = {
    "dot": Dot,
    "scaled_dot": ScaledDot,
    "bilinear": Bilinear,
    "additive": Additive,
    "additive_relu": functools.partial(Additive, activation="relu"),
    "cosine": Cosine,
}
_FIXED = {"num_heads", "head_dim", "param_dtype", "rngs"}


def score_options(score: str) -> set[str]:
    """The options a score module takes, e.g. ``{"hidden", "use_bias"}`` for additive."""
    factory = SCORE_MODULES[score]
    cls = factory.func if isinstance(factory, functools.partial) else factory
    fixed = _FIXED | set(getattr(factory, "keywords", {}))
    return set(inspect.signature(cls.__init__).parameters) - fixed - {"self"}


def make_score(
    score: str,
    num_heads: int,
    head_dim: int,
    *,
    options: Mapping[str, Any] | None = None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
) -> Score:
    """The score module registered as ``score``, built with ``options``."""
    if score not in SCORE_MODULES:
        raise ValueError(f"score: expected one of {sorted(SCORE_MODULES)}, got {score!r}")
    options = dict(options or {})
    unknown = sorted(set(options) - score_options(score))
    if unknown:
        raise ValueError(
            f"score_options for score={score!r}: unknown {unknown}; "
            f"expected a subset of {sorted(score_options(score))}"
        )
    return SCORE_MODULES[score](num_heads, head_dim, param_dtype=param_dtype, rngs=rngs, **options)
