"""Positional encodings: sinusoidal (with an amplitude), learned absolute, and rotary (RoPE).

Additive encodings map ``x [B, T, D]`` to ``x + encoding[positions]``; RoPE rotates the
queries and keys inside attention instead (``MultiHeadAttention(rope=True)``). With none of
them a model without causal masking is permutation-equivariant.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, ArrayLike, Float, Int

Positions = Int[ArrayLike, "*#B T"]


def sinusoidal(
    positions: Positions, dim: int, *, base: float = 10000.0
) -> Float[Array, "*#B T {dim}"]:
    """Vaswani et al. (2017): ``pe[t, 2i] = sin(t / base^(2i/D))``, ``pe[t, 2i+1] = cos(...)``."""
    inv_freq = base ** -(jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angle = _times(jnp.asarray(positions, jnp.float32)[..., None], inv_freq)
    pe = jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1)
    return pe.reshape(*angle.shape[:-1], -1)[..., :dim]


def rope(
    x: Float[ArrayLike, "B T N H"], positions: Positions, *, base: float = 10000.0
) -> Float[Array, "B T N H"]:
    """Rotary embedding (Su et al., 2021), half-split layout: rotates ``(x[i], x[i + H/2])``.

    ``positions`` is ``[T]`` or ``[B, T]``; the dot product of two rotated vectors depends on
    their positions only through the difference.
    """
    x = jnp.asarray(x)
    half = x.shape[-1] // 2
    if x.shape[-1] % 2:
        raise ValueError(f"rope: head size H must be even, got H={x.shape[-1]}")
    inv_freq = base ** -(jnp.arange(half, dtype=jnp.float32) / half)
    angle = _times(jnp.asarray(positions, jnp.float32)[..., None, None], inv_freq)
    angle = jax.lax.broadcast_to_rank(angle, x.ndim)  # [1 or B, T, 1, H/2]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _times(a: Array, b: Array) -> Array:
    """``a * b``, the lower-ranked one's leading axes made explicit (no rank promotion)."""
    rank = max(a.ndim, b.ndim)
    return jax.lax.broadcast_to_rank(a, rank) * jax.lax.broadcast_to_rank(b, rank)


def _add(x: Array, encoding: Array) -> Array:
    """``x [B, T, D] + encoding [*#B, T, D]`` in ``x``'s dtype."""
    return x + jax.lax.broadcast_to_rank(encoding.astype(x.dtype), x.ndim)


def default_positions(length: int) -> Int[Array, " T"]:
    """``0 .. length - 1``."""
    return jnp.arange(length)


class Sinusoidal(nnx.Module):
    """Adds ``amplitude · sinusoidal(positions, D)``; the amplitude sets how strongly position
    competes with content in the logits (tiny: ignored; huge: dominates)."""

    def __init__(self, dim: int, *, amplitude: float = 1.0, base: float = 10000.0):
        self.dim, self.amplitude, self.base = dim, amplitude, base

    def __call__(
        self, x: Float[Array, "B T D"], positions: Positions | None = None
    ) -> Float[Array, "B T D"]:
        positions = default_positions(x.shape[1]) if positions is None else positions
        pe = self.amplitude * sinusoidal(positions, self.dim, base=self.base)
        return _add(x, pe)


class Learned(nnx.Module):
    """Adds a learned table ``[max_len, D]`` (normal, std 0.02) indexed by position."""

    def __init__(self, max_len: int, dim: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.max_len = max_len
        init = nnx.initializers.normal(0.02)
        self.table = nnx.Param(init(rngs.params(), (max_len, dim), param_dtype))

    def __call__(
        self, x: Float[Array, "B T D"], positions: Positions | None = None
    ) -> Float[Array, "B T D"]:
        if positions is None:
            if x.shape[1] > self.max_len:
                raise ValueError(
                    f"inputs: sequence length {x.shape[1]} exceeds max_len={self.max_len} "
                    "of the learned positional encoding"
                )
            positions = default_positions(x.shape[1])
        return _add(x, self.table[...][positions])
