"""Non-attention baselines for the same tasks: a stacked GRU/LSTM and a causal 1-D CNN."""

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from attnjax.nn.config import ModelConfig, register
from attnjax.nn.models import Batch, InputEmbedding, check_batch, readout

CELLS = {"gru": nnx.GRUCell, "lstm": nnx.OptimizedLSTMCell}


def _orthogonal(key: Array, shape: tuple[int, ...], dtype) -> Array:
    """The cells' default recurrent init, computed in float32 (QR has no bfloat16 kernel)."""
    return nnx.initializers.orthogonal()(key, shape, jnp.float32).astype(dtype)


@register("rnn")
class Rnn(nnx.Module):
    """Embedding, ``layers`` stacked recurrent layers (``cell`` gru or lstm, flax.nnx cells),
    linear readout. Causal by construction. A batch holds ``inputs`` (and a task's ``targets``
    and ``loss_mask``): packed or padded rows (``segment_ids``, ``lengths``) are refused."""

    batch_keys: ClassVar[tuple[str, ...]] = ("inputs",)

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        cell = CELLS[config.cell]
        w = config.width
        self.embed = InputEmbedding(config, rngs=rngs)
        self.layers = nnx.List(
            [
                nnx.RNN(
                    cell(w, w, recurrent_kernel_init=_orthogonal, **config.dtypes(), rngs=rngs),
                    rngs=False,
                )
                for _ in range(config.layers)
            ]
        )
        self.readout = readout(config, rngs)

    def __call__(self, batch: Batch) -> Float[Array, "B T C"]:
        check_batch(self, batch)
        x = self.embed(batch["inputs"])
        for layer in self.layers:
            x = layer(x, initial_carry=_zero_carry(layer.cell, x))
        return self.readout(x).astype(jnp.float32)


def _zero_carry(cell: nnx.RNNCellBase, x: Float[Array, "B T D"]) -> Array | tuple[Array, Array]:
    """The cell's zero carry (GRU: h; LSTM: (c, h)), built without advancing an RNG stream, so
    the model also runs inside transformed (``vmap``-ed, ``scan``-ned) training steps."""
    h = jnp.zeros((*x.shape[:-2], cell.hidden_features), x.dtype)
    return (h, h) if isinstance(cell, nnx.OptimizedLSTMCell) else h


@register("cnn")
class CausalCnn(nnx.Module):
    """Embedding, ``layers`` residual causal convolutions ``x + gelu(conv(x))`` (kernel
    ``kernel_size``, dilation ``2^l`` in layer ``l``: receptive field
    ``1 + (kernel_size - 1)(2^layers - 1)``), linear readout. Batches as :class:`Rnn`'s."""

    batch_keys: ClassVar[tuple[str, ...]] = ("inputs",)

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        w = config.width
        self.embed = InputEmbedding(config, rngs=rngs)
        kw = {**config.dtypes(), "rngs": rngs}

        def conv(layer: int) -> nnx.Conv:
            k, dilation = (config.kernel_size,), 2**layer
            return nnx.Conv(
                w,
                w,
                k,
                padding="CAUSAL",
                kernel_dilation=dilation,
                conv_general_dilated=shifted_matmul_conv,
                **kw,
            )

        self.convs = nnx.List([conv(layer) for layer in range(config.layers)])
        self.readout = readout(config, rngs)

    def __call__(self, batch: Batch) -> Float[Array, "B T C"]:
        check_batch(self, batch)
        x = self.embed(batch["inputs"])
        for conv in self.convs:
            x = x + jax.nn.gelu(conv(x))
        return self.readout(x).astype(jnp.float32)


def shifted_matmul_conv(
    inputs: Float[Array, "B T C"],
    kernel: Float[Array, "K C O"],
    window_strides: tuple[int],
    padding: str,
    *,
    rhs_dilation: tuple[int],
    dimension_numbers: jax.lax.ConvDimensionNumbers | None,
    lhs_dilation: tuple[int] = (1,),
    feature_group_count: int = 1,
    precision=None,
    **unused,
) -> Float[Array, "B L O"]:
    """``lax.conv_general_dilated`` for what :class:`CausalCnn` asks of it (1-D, ``VALID``
    padding after the causal pad, stride 1, ungrouped, channels last) as ``K`` shifted matmuls;
    ``L = T - d(K - 1)`` for dilation ``d``. On CPU, XLA computes a dilated convolution's kernel
    gradient inside ``lax.scan`` (the fused training steps) about 30× slower than outside it;
    these matmuls are not slowed down. Other keywords must be ``None``."""
    error = "shifted_matmul_conv supports 1-D, VALID, stride 1, ungrouped, channels last only"
    if inputs.ndim != 3 or kernel.ndim != 3:
        raise ValueError(error)
    channels_last = jax.lax.conv_dimension_numbers(
        inputs.shape, kernel.shape, ("NWC", "WIO", "NWC")
    )
    layout = (window_strides, padding, lhs_dilation, feature_group_count, dimension_numbers)
    if layout != ((1,), "VALID", (1,), 1, channels_last) or any(
        v is not None for v in unused.values()
    ):
        raise ValueError(error)
    (d,), k = rhs_dilation, kernel.shape[0]
    length = inputs.shape[-2] - d * (k - 1)
    return sum(
        jnp.einsum("btc,co->bto", inputs[:, j * d : j * d + length], kernel[j], precision=precision)
        for j in range(k)
    )
