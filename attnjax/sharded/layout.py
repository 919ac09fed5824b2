"""Which positions of a sequence each device holds.

``"contiguous"``: device ``i`` of ``P`` holds chunk ``i`` of ``P`` equal chunks (the natural
sharding). ``"zigzag"``: the sequence is cut into ``2P`` chunks and device ``i`` holds chunks
``i`` and ``2P - 1 - i``: under a causal mask every device then sees about the same number of
visible (query, key) pairs, where the contiguous layout gives device ``P - 1`` all ``P``
blocks of work and device 0 one.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Int

LAYOUTS = ("contiguous", "zigzag")


@dataclasses.dataclass(frozen=True)
class Layout:
    """``name`` (one of ``LAYOUTS``) over ``shards`` devices."""

    name: str
    shards: int

    def __post_init__(self):
        if self.name not in LAYOUTS:
            raise ValueError(f"layout: expected one of {list(LAYOUTS)}, got {self.name!r}")

    @property
    def chunks_per_device(self) -> int:
        return 2 if self.name == "zigzag" else 1

    @property
    def num_chunks(self) -> int:
        return self.shards * self.chunks_per_device

    def chunk(self, device: Int[ArrayLike, ""], i: int) -> Int[ArrayLike, ""]:
        """The global chunk index of local chunk ``i`` of ``device`` (traced or not)."""
        return device if i == 0 else self.num_chunks - 1 - device

    def order(self) -> np.ndarray:
        """The global chunks in device order: device 0's first."""
        return np.array([int(self.chunk(d, i)) for d in range(self.shards)
                         for i in range(self.chunks_per_device)])  # fmt: skip

    def check(self, name: str, length: int) -> None:
        """A sequence of ``length`` splits into this layout's chunks, else ValueError."""
        if length % self.num_chunks:
            raise ValueError(
                f"{name}: sequence length {length} is not a multiple of {self.num_chunks} "
                f"({self.shards} shards, layout {self.name!r}); pad it to a multiple and pass "
                "query_seq_lengths / key_value_seq_lengths"
            )

    def to_devices(self, x: ArrayLike, axis: int = 1) -> Array:
        """A global array in natural order along ``axis`` -> in device order."""
        return _permute(x, axis, self.order(), self.num_chunks)

    def from_devices(self, x: ArrayLike, axis: int = 1) -> Array:
        """The inverse of :meth:`to_devices`."""
        return _permute(x, axis, np.argsort(self.order()), self.num_chunks)


def _permute(x: ArrayLike, axis: int, order: np.ndarray, num_chunks: int) -> Array:
    x = jnp.asarray(x)
    if np.array_equal(order, np.arange(num_chunks)):
        return x
    shape = x.shape
    chunks = x.reshape(*shape[:axis], num_chunks, -1, *shape[axis + 1 :])
    return jnp.take(chunks, order, axis=axis).reshape(shape)
