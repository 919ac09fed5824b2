"""Head importance and iterative head pruning through the per-head gates of
:class:`attnjax.nn.MultiHeadAttention` (``HeadGate``, ones when
:func:`attnjax.nn.add_head_gates` adds them, which every function here does where a layer has
none; 0 removes a head).

Gates are handled as one flat vector over all heads of all layers, in ``nnx.state`` order.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from attnjax.analysis.diagnostics import entropy, head_similarity
from attnjax.nn import HeadGate, add_head_gates, run_with_cache

LossFn = Callable[[Array, dict], Float[Array, ""]]  # (logits, batch) -> scalar


def get_gates(model: nnx.Module) -> Float[Array, " heads"]:
    """All head gates of ``model`` as one vector."""
    gates = nnx.state(add_head_gates(model), HeadGate)
    return jnp.concatenate([g.ravel() for g in jax.tree.leaves(gates)])


def set_gates(model: nnx.Module, gates: Float[Array, " heads"]) -> None:
    """Write a flat gate vector back into ``model`` (in place)."""
    state = nnx.state(add_head_gates(model), HeadGate)
    leaves, treedef = jax.tree.flatten(state)
    splits = np.cumsum([leaf.size for leaf in leaves])[:-1]
    parts = jnp.split(jnp.asarray(gates), splits)
    new = [p.reshape(leaf.shape).astype(leaf.dtype) for p, leaf in zip(parts, leaves, strict=True)]
    nnx.update(model, jax.tree.unflatten(treedef, new))


def attention_maps(model: nnx.Module, batch: dict) -> list[Float[Array, "B N T S"]]:
    """The attention weights of every :class:`MultiHeadAttention` layer of ``model`` on
    ``batch``, in the order the forward pass visits them (hook point ``pattern``,
    :func:`attnjax.nn.run_with_cache`)."""
    _, cache = run_with_cache(model, batch, names=lambda name: name.rpartition(".")[2] == "pattern")
    return list(cache.values())


def gradient_importance(model: nnx.Module, batch: dict, loss_fn: LossFn) -> Float[Array, " heads"]:
    """Michel et al. (2019): ``I_h = E_x |∂L(x)/∂ξ_h|``, the mean over examples of the absolute
    per-example gradient of the loss with respect to head ``h``'s gate ``ξ_h``."""
    model = nnx.clone(add_head_gates(model))
    nnx.pop(model, nnx.Intermediate)  # values sown by earlier calls would leak into the trace
    graphdef, gates, rest = nnx.split(model, HeadGate, ...)

    def example_loss(gates, example):
        example = jax.tree.map(lambda x: x[None], example)
        return loss_fn(nnx.merge(graphdef, gates, rest)(example), example)

    grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0))(gates, batch)
    return jnp.concatenate([jnp.mean(jnp.abs(g), 0).ravel() for g in jax.tree.leaves(grads)])


def entropy_redundancy_importance(model: nnx.Module, batch: dict) -> Float[Array, " heads"]:
    """``entropy_h / log S + (1 − max_{j≠h} sim(h, j))``: a head with sharp (low-entropy)
    attention that another head of its layer nearly copies scores low, i.e. prunable first.
    ``sim`` is the cosine of flattened attention maps (:func:`head_similarity`)."""
    scores = []
    for weights in attention_maps(model, batch):
        ent = entropy(weights).mean(axis=(0, 2)) / jnp.log(weights.shape[-1])
        sim = head_similarity(weights)
        others = jnp.where(jnp.eye(sim.shape[0], dtype=bool), -jnp.inf, sim)
        redundancy = jnp.max(others, axis=1) if sim.shape[0] > 1 else jnp.zeros(1)
        scores.append(ent + 1.0 - redundancy)
    return jnp.concatenate(scores)


def pruning_curve(
    model: nnx.Module,
    evaluate: Callable[[nnx.Module], float],
    importance: Callable[[nnx.Module], Float[Array, " heads"]] | None = None,
    *,
    key: Array | None = None,
    step_fraction: float = 0.1,
) -> list[tuple[float, float]]:
    """Prune heads iteratively, ``step_fraction`` of all heads per step, least important first;
    ``[(fraction pruned, evaluate(model)), ...]`` from 0 to 1.

    ``importance(model)`` is re-estimated after every step on the pruned model; with
    ``importance=None`` a random order drawn from ``key`` is the baseline. The model's gates are
    restored on return.
    """
    original = get_gates(model)
    num_heads = original.size
    per_step = max(1, round(step_fraction * num_heads))
    order = None if importance else np.asarray(jax.random.permutation(key, num_heads))
    curve = [(0.0, float(evaluate(model)))]
    pruned = np.zeros(num_heads, bool)
    try:
        while not pruned.all():
            if order is None:
                scores = np.where(pruned, np.inf, np.asarray(importance(model)))
                chosen = np.argsort(scores, kind="stable")[:per_step]
            else:
                chosen = order[pruned.sum() : pruned.sum() + per_step]
            pruned[chosen] = True
            set_gates(model, jnp.where(pruned, 0.0, original))
            curve.append((float(pruned.mean()), float(evaluate(model))))
    finally:
        set_gates(model, original)
    return curve
