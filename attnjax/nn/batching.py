"""Leading batch dimensions, as Flax takes them (``[batch..., length, ...]``, none included),
folded into the single batch axis attnjax's kernels take, and restored."""

import math

import jax.numpy as jnp
from jaxtyping import Array, Shaped


def flatten_batch(x: Shaped[Array, "..."], batch: tuple[int, ...], event_ndim: int) -> Array:
    """``x`` ``[*#batch, *event]`` as ``[b, *event]``: ``b = prod(batch)``, or 1 where ``x``
    is the same for the whole batch (every leading size 1, or none)."""
    event = x.shape[x.ndim - event_ndim :]
    lead = x.shape[: x.ndim - event_ndim]
    if len(lead) > len(batch):
        raise ValueError(
            f"{x.shape}: more leading dimensions than the inputs' batch dimensions {batch}"
        )
    if math.prod(lead) == 1:
        return x.reshape(1, *event)
    return jnp.broadcast_to(x, (*batch, *event)).reshape(-1, *event)


def unflatten_batch(x: Shaped[Array, "b ..."], batch: tuple[int, ...]) -> Array:
    """The inverse of :func:`flatten_batch`: ``[b, ...]`` as ``[*batch, ...]``, or with every
    leading size 1 where ``b`` is 1."""
    lead = batch if x.shape[0] == math.prod(batch) else (1,) * len(batch)
    return x.reshape(*lead, *x.shape[1:])
