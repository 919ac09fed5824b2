"""Which positions of a sequence each device holds.

``"contiguous"``: device ``i`` of ``P`` holds chunk ``i`` of ``P`` equal chunks (the natural
sharding). ``"zigzag"``: the sequence is cut into ``2P`` chunks and device ``i`` holds chunks
``i`` and ``2P - 1 - i``: under a causal mask every device then sees about the same number of
visible (query, key) pairs, where the contiguous layout gives device ``P - 1`` all ``P``
blocks of work and device 0 one.
"""

import dataclasses

import jax
import jax.numpy as jnp
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
        """2 for zigzag over several devices; on one device zigzag is the natural order."""
        return 2 if self.name == "zigzag" and self.shards > 1 else 1

    @property
    def num_chunks(self) -> int:
        return self.shards * self.chunks_per_device

    def chunk(self, device: Int[ArrayLike, ""], i: Int[ArrayLike, ""]) -> Int[ArrayLike, ""]:
        """The global chunk index of local chunk ``i`` of ``device`` (traced or not)."""
        return device + i * (self.num_chunks - 1 - 2 * device)

    def check(self, name: str, length: int) -> None:
        """A sequence of ``length`` splits into this layout's chunks, else ValueError."""
        if length % self.num_chunks:
            raise ValueError(
                f"{name}: sequence length {length} is not a multiple of {self.num_chunks} "
                f"({self.shards} shards, layout {self.name!r}); pad it to a multiple (and mask "
                "the padding, e.g. with key_value_seq_lengths)"
            )

    def deal(self, x: Array, axis_name: str, axis: int = 1) -> Array:
        """This device's shard of the natural sharding (chunks ``2d`` and ``2d + 1`` of
        ``2P``) -> its chunks in this layout, inside ``shard_map`` (two ``ppermute``)."""
        if self.chunks_per_device == 1:
            return x
        halves = jnp.split(x, 2, axis)
        moved = [
            jax.lax.ppermute(
                half, axis_name, [(d, self._owner(2 * d + h)) for d in range(self.shards)]
            )
            for h, half in enumerate(halves)
        ]
        return jnp.concatenate(self._swap_if_odd(axis_name, *moved), axis)

    def undeal(self, x: Array, axis_name: str, axis: int = 1) -> Array:
        """The inverse of :meth:`deal`."""
        if self.chunks_per_device == 1:
            return x
        by_parity = self._swap_if_odd(axis_name, *jnp.split(x, 2, axis))
        moved = [
            jax.lax.ppermute(
                chunk, axis_name, [(self._owner(2 * d + h), d) for d in range(self.shards)]
            )
            for h, chunk in enumerate(by_parity)
        ]
        return jnp.concatenate(moved, axis)

    def _owner(self, chunk: int) -> int:
        """The device that holds global chunk ``chunk``."""
        return chunk if chunk < self.shards else self.num_chunks - 1 - chunk

    def _swap_if_odd(self, axis_name: str, a: Array, b: Array) -> tuple[Array, Array]:
        """``(a, b)`` on even devices, ``(b, a)`` on odd ones: a device's chunks ``d`` and
        ``2P - 1 - d`` are its even and odd chunk in that order iff ``d`` is even."""
        even = jax.lax.axis_index(axis_name) % 2 == 0
        return jnp.where(even, a, b), jnp.where(even, b, a)
