"""Models for the toy tasks: ``batch -> logits [B, T, C]``. The transformer lives here; the
RNN and CNN baselines in :mod:`attnjax.nn.baselines`."""

from collections.abc import Mapping

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from attnjax.nn.config import ModelConfig, register
from attnjax.nn.positional import Learned, Sinusoidal
from attnjax.nn.transformer import Encoder

Batch = Mapping[str, Array]


class InputEmbedding(nnx.Module):
    """``tokens``: an embedding table for ``int[B, T]`` inputs; ``linear``: a linear map of
    raw features ``float[B, T, F]``. Both give ``[B, T, width]``."""

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
        return self.map(inputs)


def readout(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Linear:
    """The linear map ``width -> num_classes``."""
    return nnx.Linear(config.width, config.num_classes, **config.dtypes(), rngs=rngs)


@register("transformer")
class Transformer(nnx.Module):
    """Embedding, optional additive positional encoding, an :class:`Encoder` stack (causal
    with ``config.causal``; RoPE inside attention with ``positional="rope"``), linear readout.

    ``layers=1, mlp=False, norms=False`` is exactly ``readout(X + MHSA(X))``.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.causal = c.causal
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
        control attention dropout as in :class:`MultiHeadAttention`. Optional batch entries:
        ``segment_ids [B, T]`` (packed rows: attention stays within a segment),
        ``positions [B, T]`` (for the positional encoding and RoPE; packed rows restart them
        per segment) and ``lengths [B]`` (padded rows: positions from ``lengths[b]`` on are
        masked as keys and give zero attention output as queries). ``decode``: attention
        layers extend their caches (see :func:`attnjax.nn.generate`; pass ``positions``)."""
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
