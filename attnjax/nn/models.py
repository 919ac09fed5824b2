"""Models for the toy tasks: ``batch -> logits [B, T, C]``. The transformer lives here; the
RNN and CNN baselines in :mod:`attnjax.nn.baselines`."""

import difflib
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from attnjax.nn.config import ModelConfig, register
from attnjax.nn.positional import Learned, Sinusoidal
from attnjax.nn.transformer import Encoder

Batch = Mapping[str, Array]
TARGET_KEYS = ("targets", "loss_mask")  # a task's batch keys for the loss: models ignore them


def check_batch(model: nnx.Module, batch: Any) -> None:
    """Check ``batch`` against ``model.batch_keys`` (the keys it reads, ``"inputs"`` first):
    ``TypeError`` unless it is a mapping; ``ValueError`` naming any key the model neither reads
    nor ignores (:data:`TARGET_KEYS`), with the accepted keys, and for a missing ``"inputs"``.
    Python-level only: free under ``jit``."""
    name = type(model).__name__
    if not isinstance(batch, Mapping):
        shape = f" of shape {batch.shape}" if hasattr(batch, "shape") else ""
        raise TypeError(
            f"batch: {name} expects a dict {{'inputs': ..., ...}}, "
            f"got {type(batch).__name__}{shape}"
        )
    accepted = [*model.batch_keys, *TARGET_KEYS]
    for key in batch:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"batch: {name} takes no key {key!r}{hint}; accepted keys: {accepted}")
    if "inputs" not in batch:
        raise ValueError(f"batch: {name} needs the key 'inputs'; got keys {list(batch)}")


def check_tokens(tokens: Array, vocab_size: int, name: str = "inputs") -> None:
    """``ValueError`` naming ``name`` if ``tokens`` holds an id outside ``[0, vocab_size)``.
    Only concrete arrays are read (copied to the host): traced ones (under
    ``jit``, ``grad``, ``vmap``) pass, and :class:`InputEmbedding` embeds their bad ids as
    NaN."""
    traced = isinstance(tokens, jax.core.Tracer)
    if traced or tokens.size == 0 or not getattr(tokens, "is_fully_addressable", True):
        return
    ids = np.asarray(tokens)  # also inside a trace that closes over concrete inputs
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name}: token ids must be in [0, vocab_size={vocab_size}), got ids from {low} "
            f"to {high}"
        )


class InputEmbedding(nnx.Module):
    """``tokens``: an embedding table for ``int[B, T]`` inputs; ``linear``: a linear map of
    raw features ``float[B, T, F]``. Both give ``[B, T, width]``.

    Token ids must lie in ``[0, vocab_size)``: concrete inputs with another id are a
    ``ValueError`` (:func:`check_tokens`); under tracing, where the ids are not known, such an
    id embeds as NaN, so its row's logits and any loss over them are NaN, never those of
    another token."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.kind = config.embedding
        kw = {**config.dtypes(), "rngs": rngs}
        if config.embedding == "tokens":
            self.map = nnx.Embed(config.vocab_size, config.width, **kw)
        else:
            self.map = nnx.Linear(config.in_features, config.width, **kw)

    def __call__(self, inputs: Int[Array, "B T"] | Float[Array, "B T F"]) -> Float[Array, "B T D"]:
        integer = jnp.issubdtype(inputs.dtype, jnp.integer)
        if (self.kind == "tokens") != (integer and inputs.ndim == 2):
            expected = "int [B, T]" if self.kind == "tokens" else "float [B, T, F]"
            raise ValueError(
                f"inputs: embedding={self.kind!r} expects {expected}, "
                f"got {inputs.dtype} {inputs.shape}"
            )
        if self.kind == "linear":
            return self.map(inputs)
        vocab_size = self.map.num_embeddings
        check_tokens(inputs, vocab_size)
        valid = (inputs >= 0) & (inputs < vocab_size)
        return jnp.where(valid[..., None], self.map(inputs), jnp.nan)


def readout(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Linear:
    """The linear map ``width -> num_classes``."""
    return nnx.Linear(config.width, config.num_classes, **config.dtypes(), rngs=rngs)


@register("transformer")
class Transformer(nnx.Module):
    """Embedding, optional additive positional encoding, an :class:`Encoder` stack (causal
    with ``config.causal``; RoPE inside attention with ``positional="rope"``), linear readout.

    ``layers=1, mlp=False, norms=False`` is exactly ``readout(X + MHSA(X))``.

    It records what :func:`attnjax.nn.generate` checks: ``causal``, ``vocab_size`` (None for
    float features), ``num_classes``, and the config's ``task`` and ``next_token``.
    """

    batch_keys: ClassVar[tuple[str, ...]] = ("inputs", "segment_ids", "positions", "lengths")

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.causal = c.causal
        self.vocab_size = c.vocab_size if c.embedding == "tokens" else None
        self.num_classes = c.num_classes
        self.task, self.next_token = c.task, c.next_token
        self.embed = InputEmbedding(c, rngs=rngs)
        self.positional = _positional(c, rngs)
        self.encoder = Encoder(
            c.layers,
            c.width,
            c.heads,
            mlp=c.mlp,
            mlp_ratio=c.mlp_ratio,
            norms=c.norms,
            num_kv_heads=c.kv_heads,
            score=c.score,
            score_options=c.score_options(),
            **c.attention_options(),
            normalize_qk=c.qk_norm,
            rope=c.positional == "rope",
            dropout_rate=c.dropout,
            implementation=c.implementation,
            sequence_parallel=c.sequence_parallel(),
            **c.mods(rngs),
            **c.dtypes(),
            rngs=rngs,
        )
        self.readout = readout(c, rngs)

    def __call__(
        self,
        batch: Batch,
        *,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
        decode: bool | None = None,
    ) -> Float[Array, "B T C"]:
        """Logits of ``batch``; ``deterministic`` and ``rngs`` (an ``nnx.Rngs`` or a key)
        control attention dropout as in :class:`MultiHeadAttention`. The batch is checked
        (:func:`check_batch`): ``"inputs"``, the optional entries below and a task's
        ``targets`` and ``loss_mask`` (ignored) are its only keys. Optional batch entries:
        ``segment_ids [B, T]`` (packed rows: attention stays within a segment),
        ``positions [B, T]`` (for the positional encoding and RoPE; packed rows restart them
        per segment) and ``lengths [B]`` (padded rows: positions from ``lengths[b]`` on are
        masked as keys and give zero attention output as queries). ``decode``: attention
        layers extend their caches (see :func:`attnjax.nn.generate`; pass ``positions``)."""
        check_batch(self, batch)
        positions = batch.get("positions")
        if decode and positions is None:
            raise ValueError("positions: decoding needs each token's position in the batch")
        x = self.embed(batch["inputs"])
        if self.positional is not None:
            x = self.positional(x, positions)
        x = self.encoder(
            x,
            is_causal=self.causal,
            positions=positions,
            segment_ids=batch.get("segment_ids"),
            lengths=batch.get("lengths"),
            deterministic=deterministic,
            rngs=rngs,
            decode=decode,
        )
        return self.readout(x).astype(jnp.float32)


def _positional(c: ModelConfig, rngs: nnx.Rngs) -> Sinusoidal | Learned | None:
    """The additive positional encoding (RoPE and none add nothing)."""
    if c.positional == "sinusoidal":
        return Sinusoidal(c.width, amplitude=c.pos_amplitude)
    if c.positional == "learned":
        return Learned(c.max_len, c.width, param_dtype=c.dtypes()["param_dtype"], rngs=rngs)
    return None
