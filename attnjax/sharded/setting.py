""":class:`SequenceParallel`: the setting a module takes to shard its attention's sequence."""

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Float

from attnjax.sharded.global_arrays import ring_attention
from attnjax.sharded.layout import Layout
from attnjax.sharded.ring import STRATEGIES


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
    """The sequence-parallel setting of a module: its attention sharded over ``mesh`` axis ``axis``.

    Calling it runs :func:`attnjax.sharded.ring_attention` with this ``strategy`` and
    ``layout``."""

    mesh: Mesh
    axis: str = "seq"
    strategy: str = "ring"
    layout: str | None = None

    def __post_init__(self):
        if self.axis not in self.mesh.axis_names:
            raise ValueError(
                f"axis: {self.axis!r} is not an axis of the mesh {self.mesh.axis_names}"
            )
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {list(STRATEGIES)}, got {self.strategy!r}")
        if self.layout is not None:
            Layout(self.layout, self.mesh.shape[self.axis])  # checks the name

    @classmethod
    def over(cls, shards: int, *, axis: str = "seq", **options: Any) -> "SequenceParallel":
        """Over the first ``shards`` devices, in a mesh of one axis."""
        devices = jax.devices()
        if not 1 <= shards <= len(devices):
            raise ValueError(
                f"sequence shards: expected 1 to {len(devices)} (the devices present), got "
                f"{shards}; on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N"
            )
        return cls(Mesh(np.array(devices[:shards]), (axis,)), axis, **options)

    def __call__(self, query, key, value, **attention_kwargs: Any) -> Float[Array, "B T N Hv"]:
        """``ring_attention(query, key, value, **attention_kwargs)`` over this mesh axis."""
        return ring_attention(
            query, key, value, mesh=self.mesh, axis=self.axis, strategy=self.strategy,
            layout=self.layout, **attention_kwargs,
        )  # fmt: skip
