"""``ModelConfig`` (frozen, typed, validated on construction) and ``build`` by name."""

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from attnjax.nn.mods import MASK_MODS, SCORE_MODS, make_mod
from attnjax.nn.scores import SCORE_MODULES
from attnjax.scores import SCORES
from attnjax.sharded import STRATEGIES, SequenceParallel

MODELS: dict[str, Callable[..., nnx.Module]] = {}
POSITIONAL = ("none", "sinusoidal", "learned", "rope")
EMBEDDINGS = ("tokens", "linear")
CELLS = ("gru", "lstm")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_INITS = ("xavier", "lecun")


def register(name: str) -> Callable:
    """Class decorator: ``@register("transformer")`` makes ``ModelConfig(kind=name)`` build it
    as ``cls(config, rngs=rngs)``."""

    def add(cls):
        MODELS[name] = cls
        return cls

    return add


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A model, as the experiment configs name it. A model maps a batch
    ``{"inputs": int[B, T] | float[B, T, F], ...}`` to float32 logits ``[B, T, num_classes]``.

    All kinds read ``kind, width, layers, embedding, vocab_size | in_features, num_classes,
    dtype, param_dtype``. ``transformer`` also reads the attention fields (``heads`` ...
    ``sequence_strategy``), ``mlp``/``mlp_ratio``/``norms`` and ``causal``; ``rnn`` reads ``cell``;
    ``cnn`` reads ``kernel_size`` (dilation doubles per layer). Other fields are ignored.
    ``task`` and ``next_token`` record the task the model is for (an experiment config derives
    them from the task's declaration); the transformer keeps them, and
    :func:`attnjax.nn.generate` refuses a model whose task is not next-token prediction.
    """

    kind: str = "transformer"
    width: int = 64
    layers: int = 1
    # attention
    heads: int = 1
    head_dim: int | None = None  # head size H; None: width // heads
    attention_init: str = "xavier"  # projection kernels: xavier | lecun (variance 1/fan_in)
    kv_heads: int | None = None  # None: = heads (MHA); 1: MQA
    score: str = "scaled_dot"
    score_hidden: int | None = None  # additive scores: hidden size A (default: head size)
    score_bias: bool = True  # additive scores: bias b
    score_bias_init: float = 0.0  # additive scores: initial value of every entry of b
    learnable_scale: bool = False  # scaled_dot: learnable γ = 1/τ per head
    cosine_scale: float | None = None  # cosine: a fixed scale g; None: learnable (QKNorm init)
    qk_norm: bool = False
    positional: str = "none"  # none | sinusoidal | learned | rope
    pos_amplitude: float = 1.0  # sinusoidal amplitude
    max_len: int = 256  # learned table size; also sets the cosine score's initial scale
    causal: bool = False
    score_mod: str | None = None  # attnjax.nn.mods.SCORE_MODS: alibi | learnable_alibi | ...
    softcap: float = 30.0  # score_mod="softcap": the cap
    relative_buckets: int = 32  # score_mod="relative_position_bias": T5 buckets
    mask_mod: str | None = None  # attnjax.nn.mods.MASK_MODS: sliding_window | dilated | ...
    mask_mod_size: int = 128  # sliding_window: keys to the left; dilated: the stride
    dropout: float = 0.0  # on attention weights
    implementation: str | None = None
    sequence_shards: int | None = None  # shard the sequence over this many devices (ring)
    sequence_strategy: str = "ring"  # ring | all_gather (attnjax.sharded)
    # blocks
    mlp: bool = True
    mlp_ratio: int = 4
    norms: bool = True
    # input and output
    embedding: str = "tokens"  # tokens: int inputs, an embedding table; linear: float features
    vocab_size: int | None = None
    in_features: int | None = None
    num_classes: int = 2
    task: str | None = None  # the registered task the model is for
    next_token: bool | None = None  # is that task next-token prediction? (None: unknown)
    # baselines
    cell: str = "gru"  # rnn: gru | lstm
    kernel_size: int = 3  # cnn
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_type(field.name, getattr(self, field.name), field.type)
        _one_of("kind", self.kind, sorted(MODELS))
        if self.dropout > 0 and self.kind != "transformer":
            raise ValueError(f"dropout: only the transformer has dropout, got kind={self.kind!r}")
        _one_of("score", self.score, sorted(SCORE_MODULES))
        _one_of("attention_init", self.attention_init, ATTENTION_INITS)
        _one_of("score_mod", self.score_mod, [None, *sorted(SCORE_MODS)])
        _one_of("mask_mod", self.mask_mod, [None, *sorted(MASK_MODS)])
        _one_of("positional", self.positional, POSITIONAL)
        _one_of("sequence_strategy", self.sequence_strategy, STRATEGIES)
        _one_of("embedding", self.embedding, EMBEDDINGS)
        _one_of("cell", self.cell, CELLS)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("param_dtype", self.param_dtype, DTYPES)
        for name in ("width", "layers", "heads", "max_len", "mlp_ratio", "num_classes"):
            _positive(name, getattr(self, name))
        optional = ("head_dim", "kv_heads", "score_hidden", "vocab_size", "in_features",
                    "sequence_shards")  # fmt: skip
        for name in (*optional, "kernel_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.head_dim is None and self.width % self.heads:
            raise ValueError(f"heads: expected a divisor of width={self.width}, got {self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads: expected a divisor of heads={self.heads}, got {self.kv_heads}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a value in [0, 1), got {self.dropout}")
        if self.sequence_shards is not None and (self.dropout or self.implementation):
            raise ValueError(
                "sequence_shards: sequence-parallel attention takes no attention dropout and "
                f"chooses its own per-device implementation; got dropout={self.dropout}, "
                f"implementation={self.implementation!r}"
            )
        needed = "vocab_size" if self.embedding == "tokens" else "in_features"
        if getattr(self, needed) is None:
            raise ValueError(f"{needed}: required with embedding={self.embedding!r}")
        if self.score_hidden is not None and not self.additive:
            raise ValueError(f"score_hidden: applies to additive scores, not {self.score!r}")
        if self.score_bias_init and not (self.additive and self.score_bias):
            raise ValueError(
                f"score_bias_init: applies to additive scores with score_bias=True, got "
                f"score={self.score!r}, score_bias={self.score_bias}"
            )
        if self.cosine_scale is not None and (self.score != "cosine" or self.cosine_scale <= 0):
            raise ValueError(
                f"cosine_scale: expected a positive scale with score='cosine', got "
                f"{self.cosine_scale!r} with score={self.score!r}"
            )
        if self.learnable_scale and self.score != "scaled_dot":
            raise ValueError(f"learnable_scale: applies to score='scaled_dot', not {self.score!r}")

    @property
    def additive(self) -> bool:
        """The score forms hidden features (Bahdanau's additive scores)."""
        return self.score in SCORES and SCORES[self.score].hidden

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
        """A config from a plain dict; unknown keys are an error naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(
                f"ModelConfig: unknown keys {unknown}; expected some of {sorted(names)}"
            )
        return cls(**values)

    def attention_options(self) -> dict[str, Any]:
        """``qkv_features`` (``heads · head_dim``, or the width) and ``kernel_init`` for every
        :class:`~attnjax.nn.MultiHeadAttention`: ``lecun`` draws each projection kernel with
        variance ``1/fan_in``, so unit-variance inputs give unit-variance q and k whatever H."""
        qkv = self.width if self.head_dim is None else self.heads * self.head_dim
        init = {"xavier": nnx.initializers.xavier_uniform, "lecun": nnx.initializers.lecun_normal}
        return {"qkv_features": qkv, "kernel_init": init[self.attention_init]()}

    def mods(self, rngs: nnx.Rngs) -> dict[str, Any]:
        """``score_mod`` and ``mask_mod`` for :class:`~attnjax.nn.MultiHeadAttention`."""
        score_options = {
            "softcap": {"cap": self.softcap},
            "relative_position_bias": {"num_buckets": self.relative_buckets},
        }.get(self.score_mod, {})
        size = (
            {"size": self.mask_mod_size} if self.mask_mod in ("sliding_window", "dilated") else {}
        )
        return {
            "score_mod": make_mod("score_mod", self.score_mod, score_options, self.heads, rngs),
            "mask_mod": make_mod("mask_mod", self.mask_mod, size, self.heads, rngs),
        }

    def sequence_parallel(self) -> SequenceParallel | None:
        """The attention layers' sequence sharding: over the first ``sequence_shards``
        devices, mesh axis ``"seq"``; None without ``sequence_shards``."""
        if self.sequence_shards is None:
            return None
        return SequenceParallel.over(self.sequence_shards, strategy=self.sequence_strategy)

    def score_options(self) -> dict[str, Any]:
        """Options for the score module (see :mod:`attnjax.nn.scores`)."""
        if self.additive:
            return {
                "hidden": self.score_hidden,
                "use_bias": self.score_bias,
                "bias_init": self.score_bias_init,
            }
        if self.score == "scaled_dot":
            return {"learnable_scale": self.learnable_scale}
        if self.score == "cosine":
            fixed = {"init_scale": self.cosine_scale, "learnable": False}
            return {"length": self.max_len} | (fixed if self.cosine_scale is not None else {})
        return {}

    @property
    def receptive_field(self) -> int | None:
        """How many positions (itself included) a causal CNN's output sees: dilation ``2^l``
        in layer ``l`` gives ``1 + (kernel_size - 1)(2^layers - 1)``; None for other kinds."""
        if self.kind != "cnn":
            return None
        return 1 + (self.kernel_size - 1) * (2**self.layers - 1)

    def dtypes(self) -> dict[str, Any]:
        """``{"dtype": ..., "param_dtype": ...}`` as JAX dtypes for module constructors."""
        return {"dtype": jnp.dtype(self.dtype), "param_dtype": jnp.dtype(self.param_dtype)}


def build(config: ModelConfig | Mapping[str, Any], rngs: nnx.Rngs) -> nnx.Module:
    """The model named by ``config.kind`` (a :class:`ModelConfig` or a plain dict of one)."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    return MODELS[config.kind](config, rngs=rngs)


def check_type(name: str, value: Any, tp: Any) -> None:
    """``TypeError`` naming ``name`` unless ``value`` is an instance of the annotation ``tp``
    (a type or a ``|`` union); ints pass as floats, bools never pass as numbers."""
    allowed = tp.__args__ if isinstance(tp, types.UnionType) else (tp,)
    allowed = tuple(type(None) if a is None else a for a in allowed)
    ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        names = " | ".join(getattr(a, "__name__", str(a)) for a in allowed)
        raise TypeError(f"{name}: expected {names}, got {value!r} ({type(value).__name__})")


def _one_of(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value}")
