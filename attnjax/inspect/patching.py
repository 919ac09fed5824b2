"""Activation patching over (layer, head) and (layer, position), and direct logit
attribution per head, with :func:`attnjax.nn.run_with_hooks` and
:func:`attnjax.nn.run_with_cache`."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from attnjax.nn.hooks import run_with_cache, run_with_hooks

Metric = Callable[[Any, Any], Float[Array, ""]]


@dataclasses.dataclass(frozen=True)
class Table:
    """``values [R, C]`` named ``name``, with its axes' names (``("layer", "head")``) and
    the labels of its rows and columns."""

    values: Float[Array, "R C"]
    name: str
    axes: tuple[str, str]
    labels: tuple[tuple[str, ...], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class PatchingTable(Table):
    """A patching sweep: ``values`` normalized as ``(raw - corrupted) / (clean - corrupted)``
    (1: the patch restores the clean metric, 0: no effect; ``nan`` or ``inf`` when the clean
    and corrupted metrics are equal), ``raw [R, C]`` the metric of each patched run, and the
    ``clean`` and ``corrupted`` runs' metrics."""

    raw: Float[Array, "R C"]
    clean: Float[Array, ""]
    corrupted: Float[Array, ""]


def patch_heads(
    model: nnx.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    point: str = "attention.z",
    *,
    dense: bool = False,
) -> PatchingTable:
    """Patch each (layer, head) of ``point`` (a point with a head axis: ``"attention.z"``,
    ``"attention.q"``, ``"attention.pattern"``, ...) from the ``clean`` run into the
    ``corrupted`` one, alone, and score each run by ``metric(output, clean)``.

    ``metric(output, batch) -> scalar`` always receives the clean batch (the behaviour the
    patch restores: close over the corrupted batch if it needs it). The two batches have the
    same shapes. One ``jax.jit`` computes the whole table, each layer's heads under one
    ``jax.vmap``: ``[L, N]``. ``dense``: as in :func:`~attnjax.nn.run_with_hooks`, needed to
    patch ``logits`` or ``pattern`` of layers on a tiled path (they then run on the dense
    path).
    """
    return _sweep(model, clean, corrupted, metric, point, "head", dense)


def patch_positions(
    model: nnx.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    point: str = "resid_pre",
    *,
    dense: bool = False,
) -> PatchingTable:
    """Patch each (layer, position) of ``point`` (default: the residual stream entering each
    block, TransformerLens's ``resid_pre`` sweep) from ``clean`` into ``corrupted``, alone
    (all batch rows at once): ``[L, T]``. As :func:`patch_heads` otherwise."""
    return _sweep(model, clean, corrupted, metric, point, "position", dense)


def _sweep(model, clean, corrupted, metric, point, over, dense) -> PatchingTable:
    shapes = [jax.tree.map(jnp.shape, b) for b in (clean, corrupted)]
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"corrupted: expected the clean batch's shapes {shapes[0]}, got {shapes[1]}"
        )
    labels, names, axis, shape = _points(model, clean, point, over)
    mask_shape = [1] * len(shape)
    mask_shape[axis] = shape[axis]
    graphdef, state = nnx.split(model)

    @jax.jit
    def table(state, clean, corrupted):
        model = nnx.merge(graphdef, state)
        clean_out, cache = run_with_cache(model, clean, names=names)

        def patched(name, index):
            chosen = (jnp.arange(shape[axis]) == index).reshape(mask_shape)
            hook = {name: lambda value, context: jnp.where(chosen, cache[name], value)}
            return metric(run_with_hooks(model, corrupted, hook, dense=dense), clean)

        cells = jnp.arange(shape[axis])
        raw = jnp.stack([jax.vmap(functools.partial(patched, name))(cells) for name in names])
        return raw, metric(clean_out, clean), metric(model(corrupted), clean)

    raw, clean_metric, corrupted_metric = table(state, clean, corrupted)
    normalized = (raw - corrupted_metric) / (clean_metric - corrupted_metric)
    return PatchingTable(
        values=normalized,
        name=f"patched {point}: normalized metric",
        axes=("layer", over),
        labels=(labels, tuple(map(str, range(shape[axis])))),
        raw=raw,
        clean=clean_metric,
        corrupted=corrupted_metric,
    )


def _points(model, batch, point, over):
    """``(labels, names, axis, shape)`` of ``point`` in each layer (in layer order), found by
    tracing ``model`` on ``batch`` without computing: the labels are the layers' indices (or
    their paths where two stacks share an index), ``axis`` the ``over`` axis of the value."""
    points = {}  # name -> (context, shape), read while tracing

    def trace(batch):
        _, cache = run_with_cache(model, batch, names=lambda n: n.endswith(f".{point}"))
        points.update({n: (cache.context(n), cache[n].shape) for n in cache})

    jax.eval_shape(trace, batch)
    found = sorted((c.layer, n) for n, (c, _) in points.items() if c.point == point)
    if not found or any(layer is None for layer, _ in found):
        raise ValueError(
            f"point: {point!r} names no point in a list of layers; found: {sorted(points)}"
        )
    context, shape = points[found[0][1]]
    axis = context.head_axis if over == "head" else context.position_axis
    if axis is None:
        raise ValueError(f"point: {point!r} has no {over} axis")
    layers = [layer for layer, _ in found]
    labels = tuple(
        str(layer) if layers.count(layer) == 1 else name.removesuffix(f".{point}")
        for layer, name in found
    )
    return labels, [name for _, name in found], axis % len(shape), shape


@dataclasses.dataclass(frozen=True)
class LogitAttribution:
    """The output logits ``[B, T, C]`` of a :class:`~attnjax.nn.Transformer` split into
    linear terms: ``heads [L, B, T, N, C]`` (each head's ``result``), ``embed [B, T, C]`` (the
    direct path: the embedding and positional encoding entering the first block), ``mlp
    [L, B, T, C]`` (zeros without MLPs) and ``bias [B, T, C]`` (the attention output
    projections' biases, the final norm's bias and the readout's bias). :meth:`total` sums
    them: the logits."""

    heads: Float[Array, "L B T N C"]
    embed: Float[Array, "B T C"]
    mlp: Float[Array, "L B T C"]
    bias: Float[Array, "B T C"]

    def total(self) -> Float[Array, "B T C"]:
        return self.heads.sum((0, 3)) + self.embed + self.mlp.sum(0) + self.bias


def logit_attribution(model: nnx.Module, batch: Any) -> LogitAttribution:
    """Direct logit attribution of every head of a :class:`~attnjax.nn.Transformer` (a token
    or class readout) on ``batch``: each term of the final residual stream through the final
    norm's linearization and the readout.

    The final LayerNorm ``(x - mean(x)) / σ(x) · γ + β`` is linear in ``x`` once ``σ`` is
    fixed: as TransformerLens does with its cached scale, ``σ`` per position is taken from
    the run's own final residual stream, each term is centred, divided by it and scaled by
    ``γ``, and ``β`` joins the bias term. The terms then sum to the logits exactly (up to
    float32 rounding); a model without norms needs no linearization.
    """
    encoder, readout = getattr(model, "encoder", None), getattr(model, "readout", None)
    if encoder is None or not isinstance(readout, nnx.Linear):
        raise TypeError(f"model: expected an attnjax.nn.Transformer, got {type(model).__name__}")
    points = ("attention.result", "resid_pre", "mlp_out", "resid_post")
    _, cache = run_with_cache(model, batch, names=lambda n: n.endswith(points))
    final = cache.stack("resid_post")[-1]
    norm, kernel = encoder.norm, readout.kernel[...]

    def direct(x):  # a term of the final residual stream [..., B, T, (N,) D] -> [..., C]
        if norm is not None:
            centred = final - final.mean(-1, keepdims=True)
            sigma = jnp.sqrt((centred**2).mean(-1, keepdims=True) + norm.epsilon)  # [B, T, 1]
            sigma = sigma[:, :, None] if x.ndim == 5 else sigma  # a head axis
            x = (x - x.mean(-1, keepdims=True)) / jax.lax.broadcast_to_rank(sigma, x.ndim)
            if norm.scale is not None:
                x = x * jax.lax.broadcast_to_rank(norm.scale[...], x.ndim)
        return x @ kernel

    heads = direct(cache.stack("attention.result"))
    blocks = encoder.blocks
    has_mlp = blocks[0].mlp is not None
    mlp = direct(cache.stack("mlp_out")) if has_mlp else jnp.zeros_like(heads[:, :, :, 0])
    biases = [b.attention.out.bias[...] for b in blocks if b.attention.out.bias is not None]
    bias = direct(jnp.broadcast_to(sum(biases, jnp.zeros(final.shape[-1])), final.shape))
    if norm is not None and norm.bias is not None:
        bias = bias + (norm.bias[...] @ kernel)[None, None]
    if readout.bias is not None:
        bias = bias + readout.bias[...][None, None]
    embed = direct(cache.stack("resid_pre")[0])
    return LogitAttribution(heads=heads, embed=embed, mlp=mlp, bias=bias)
