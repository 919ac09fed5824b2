"""Sequence-parallel attention across devices: the query and key sequences sharded over a mesh
axis, every score, mask and mod of :func:`attnjax.attention` with global positions.

:func:`ring_attention` takes global arrays and a mesh; :func:`ring_attention_shard` is the same
on the local shards, inside a ``shard_map`` of one's own; :class:`SequenceParallel` is the
setting NNX modules take (``MultiHeadAttention(sequence_parallel=...)``). Strategies and layouts:
:mod:`attnjax.sharded.ring`, :mod:`attnjax.sharded.layout`; the algorithm: ``docs/tiled.md``.
"""

from attnjax.sharded.global_arrays import ring_attention
from attnjax.sharded.layout import LAYOUTS, Layout
from attnjax.sharded.ring import STRATEGIES, ring_attention_shard
from attnjax.sharded.setting import SequenceParallel

__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "Layout",
    "SequenceParallel",
    "ring_attention",
    "ring_attention_shard",
]
