"""Named hook points: read (:func:`run_with_cache`) or replace (:func:`run_with_hooks`) the
values inside a model's attention layers and blocks, by names that follow the parameter
paths (``encoder.blocks.1.attention.pattern``).

Points of a :class:`~attnjax.nn.MultiHeadAttention` at path ``p``: ``p.q [*B, T, N, H]``,
``p.k``, ``p.v [*B, S, K, H]`` (after QK-norm and RoPE), ``p.logits`` and ``p.pattern
[*B, N, T, S]`` (score, bias, temperature and ``score_mod``, masked keys ``-inf``; the
softmax weights), ``p.z [*B, T, N, H]`` (each head's output, gated, before the output
projection) and ``p.result [*B, T, N, D]`` (each head's term of the output: the output is
their sum plus the projection's bias). While decoding, ``k`` and ``v`` are the new
positions' (before they join the cache). A layer with ``attention_fn`` or
``sequence_parallel`` has no ``logits`` or ``pattern``. Points of a
:class:`~attnjax.nn.Block` at ``p``: ``p.resid_pre``, ``p.mlp_out``, ``p.resid_post
[B, T, D]``.

Hooks act while the model is traced (Python-level), so both functions work inside
``jax.jit``, ``jax.grad`` and ``jax.vmap``. With no hook active every point returns its
value as it is: the model runs the same operations as without this module.
"""

import contextlib
import contextvars
import dataclasses
import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from attnjax.attention import attention, prepare_call
from attnjax.dense import dense_attention
from attnjax.nn.batching import unflatten_batch
from attnjax.patterns import attention_rows, logit_rows

# point -> (head axis, query-position axis, key-position axis), counted from the end
AXES = {
    "q": (-2, -3, None),
    "k": (-2, None, -3),
    "v": (-2, None, -3),
    "logits": (-3, -2, -1),
    "pattern": (-3, -2, -1),
    "z": (-2, -3, None),
    "result": (-2, -3, None),
    "resid_pre": (None, -2, None),
    "mlp_out": (None, -2, None),
    "resid_post": (None, -2, None),
}
PATTERN_POINTS = ("logits", "pattern")


@dataclasses.dataclass(frozen=True)
class HookContext:
    """Where a hook's value comes from: its full ``name``; ``layer``, the first integer in
    the path (``None`` outside a list of layers); ``point``, the name after the layer
    (``"attention.pattern"``); the axes of heads, query positions and key positions in the
    value (negative, so they hold for any leading batch dimensions; ``None``: absent)."""

    name: str
    point: str
    layer: int | None
    head_axis: int | None
    position_axis: int | None
    key_axis: int | None


HookFn = Callable[[Array, HookContext], Array]
NameFilter = str | Sequence[str] | Callable[[str], bool] | None


@jax.tree_util.register_pytree_node_class
class ActivationCache(Mapping):
    """The values :func:`run_with_cache` read, by name (a pytree: it leaves ``jax.jit``).

    ``cache[name]``; ``cache[point, layer]`` and ``cache[point, layer, head]`` (``point`` as
    in :class:`HookContext`, ``head`` an index or a list of indices along the head axis);
    :meth:`stack` gives a point across layers ``[L, ...]``; :meth:`context` a name's
    :class:`HookContext`. Where two stacks of layers share a point and an index (an encoder's
    and a decoder's), indexing by layer is a ``KeyError`` naming them: index by name.
    """

    def __init__(self, values: Mapping[str, Any], contexts: Mapping[str, HookContext]):
        self._values, self._contexts = dict(values), dict(contexts)

    def __getitem__(self, key: str | tuple) -> Any:
        if isinstance(key, str):
            return self._values[key]
        point, layer, *head = key
        names = [n for n, c in self._contexts.items() if (c.point, c.layer) == (point, layer)]
        if len(names) != 1:
            found = f"several: {names}; index by name" if names else f"cached: {sorted(self)}"
            raise KeyError(f"{len(names) or 'no'} cached {point!r} at layer {layer}; {found}")
        value, context = self._values[names[0]], self._contexts[names[0]]
        if not head:
            return value
        if context.head_axis is None:
            raise KeyError(f"{names[0]}: has no head axis")
        return jnp.take(value, jnp.asarray(head[0]), axis=context.head_axis)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def context(self, name: str) -> HookContext:
        return self._contexts[name]

    def stack(self, point: str) -> Array:
        """``point`` of every layer, stacked in layer order: ``[L, ...]``."""
        found = sorted(
            (c.layer, n)
            for n, c in self._contexts.items()
            if c.point == point and c.layer is not None
        )
        if not found:
            raise KeyError(f"no cached {point!r} in any layer; cached: {sorted(self)}")
        layers = [layer for layer, _ in found]
        if len(set(layers)) < len(layers):
            names = [n for _, n in found]
            raise KeyError(f"{point!r}: several stacks of layers ({names}); stack by name")
        return jnp.stack([self._values[n] for _, n in found])

    def tree_flatten(self):
        names = tuple(self._values)
        return [self._values[n] for n in names], (names, tuple(self._contexts[n] for n in names))

    @classmethod
    def tree_unflatten(cls, aux, children):
        names, contexts = aux
        return cls(dict(zip(names, children, strict=True)), dict(zip(names, contexts, strict=True)))


def run_with_cache(
    model: nnx.Module,
    batch: Any,
    names: NameFilter = None,
    *,
    rows: Sequence[int] | Array | None = None,
    heads: Sequence[int] | Array | None = None,
    **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """``(model(batch, **kwargs), cache)``: the values of the hook points ``names`` selects
    (``None``: all; a name or a glob such as ``"*.attention.z"``, a list of them, or a
    predicate on names). The output is the model's own.

    Each layer runs its own implementation. ``logits`` and ``pattern`` are recomputed from
    the saved log-sum-exp for the query ``rows`` and ``heads`` chosen
    (:func:`attnjax.patterns.attention_rows`: ``[*B, M, R, S]``, O(rows × S) memory, on
    every implementation); ``rows=None`` asks for the full pattern, refused past
    :data:`attnjax.patterns.FULL_PATTERN_MAX_LOGITS` with a pointer to ``rows=``.
    A name or glob that matches no point is a ``ValueError`` listing the points.
    """
    session = _Session(model, cached=_filter(names), rows=rows, heads=heads)
    with session.active():
        out = model(batch, **kwargs)
    session.check_names(names)
    return out, ActivationCache(session.values, session.contexts)


def run_with_hooks(
    model: nnx.Module,
    batch: Any,
    hooks: Mapping[str, HookFn],
    *,
    dense: bool = False,
    **kwargs: Any,
) -> Any:
    """``model(batch, **kwargs)`` with each hook point named in ``hooks`` (a name or a glob)
    replaced by ``fn(value, context)`` (:class:`HookContext`; the same shape; cast to the
    value's dtype); several matching functions apply in order. Patching, ablation and head
    masking are such functions. Replacing ``result`` makes the output the sum of the heads'
    results plus the bias (equal to the fused projection up to float32 rounding; the call's
    ``out_sharding`` is not applied to it).

    Replacing ``logits`` or ``pattern`` needs the dense weights: a layer with a tiled
    ``implementation`` raises unless ``dense=True``, which runs the layers with such hooks
    (only those) on the dense path. A name or glob that matches no
    point is a ``ValueError`` listing the points.
    """
    session = _Session(model, hooks=dict(hooks), dense=dense)
    with session.active():
        out = model(batch, **kwargs)
    session.check_names(list(hooks))
    return out


def point(module: nnx.Module, name: str, value: Array, batch: tuple[int, ...] | None = None):
    """Hook point ``name`` of ``module``: ``value`` as it is unless a hook is active.
    ``batch``: the leading batch dimensions folded in ``value``'s first axis (restored for
    the hook)."""
    session = _ACTIVE.get()
    return value if session is None else session.visit(module, name, value, batch)


def project(module: nnx.Module, z: Float[Array, "*B T N H"], out_sharding: Any = None) -> Array:
    """``module.out(z)``: the output projection of a :class:`MultiHeadAttention`, with its
    ``result`` point formed (each head's term ``[*B, T, N, D]``) only when it is hooked."""
    session = _ACTIVE.get()
    name = None if session is None else session.name(module, "result")
    if name is None or not session.wants(name):
        return module.out(z, out_sharding=out_sharding)
    proj = module.out
    bias = None if proj.bias is None else proj.bias[...]
    terms, kernel, bias = proj.promote_dtype((z, proj.kernel[...], bias), dtype=proj.dtype)
    result = jnp.einsum("...nh,nhd->...nd", terms, kernel, precision=proj.precision)
    replaced = session.visit(module, "result", result)
    if not session.replaces(name):
        return module.out(z, out_sharding=out_sharding)
    out = replaced.sum(-2)
    return out if bias is None else out + jax.lax.broadcast_to_rank(bias, out.ndim)


def patterns(module: nnx.Module) -> "_Patterns | None":
    """The hooked attention of ``module`` when its ``logits`` or ``pattern`` are read or
    replaced, else ``None``. Layers with ``attention_fn`` or ``sequence_parallel`` form no
    weights: they have no such points."""
    session = _ACTIVE.get()
    if session is None or module.sequence_parallel is not None or module.attention_fn is not None:
        return None
    names = [session.name(module, p) for p in PATTERN_POINTS]
    if not any(n is not None and session.wants(n) for n in names):
        return None
    return _Patterns(session, module, replaced=any(session.replaces(n) for n in names))


@dataclasses.dataclass
class _Patterns:
    session: "_Session"
    module: nnx.Module
    replaced: bool

    def attend(self, q, k, v, batch, implementation, dense, block_mask, common):
        """``(out, weights, lse)`` as the module's attention call gives them (``weights``
        and ``lse`` only when ``dense``), with the logits and pattern hooked."""
        session, module = self.session, self.module
        if self.replaced:
            if implementation not in (None, "xla") and not session.dense:
                raise ValueError(
                    f"{session.name(module, 'pattern')}: replacing logits or pattern needs the "
                    f"dense weights; this layer runs implementation={implementation!r}. Pass "
                    "dense=True to run_with_hooks to run the hooked layers on the dense path"
                )
            query, key, value, call, _ = prepare_call(q, k, v, block_mask=block_mask, **common)

            def hook(name, x):
                return session.visit(module, name, x, batch)

            return dense_attention(query, key, value, call, hook=hook)
        # the full pattern on the dense path: the weights it forms, not a recomputation
        formed = implementation in (None, "xla") and session.rows is None and session.heads is None
        out, *extras = attention(
            q, k, v, return_weights=dense or formed, return_lse=True,
            implementation=implementation, block_mask=block_mask, **common,
        )  # fmt: skip
        lse = extras[-1]
        for name, rows_of in (("logits", logit_rows), ("pattern", attention_rows)):
            args = (q, k, lse) if name == "pattern" else (q, k)
            if session.wants(session.name(module, name)):
                if name == "pattern" and formed:
                    value = extras[0]
                else:
                    value = rows_of(
                        *args, session.rows, heads=session.heads, block_mask=block_mask, **common
                    )
                session.visit(module, name, value, batch)
        return (out, extras[0], lse) if dense else (out, None, None)


class _Session:
    """One run's hooks: the model's module paths, the functions, what to cache."""

    def __init__(self, model, *, hooks=None, cached=None, rows=None, heads=None, dense=False):
        self.paths = {id(m): ".".join(map(str, p)) for p, m in nnx.iter_modules(model)}
        self.hooks, self.cached = hooks or {}, cached or (lambda name: False)
        self.rows, self.heads, self.dense = rows, heads, dense
        self.values: dict[str, Array] = {}
        self.contexts: dict[str, HookContext] = {}
        self.seen: dict[str, None] = {}  # the points visited, in order

    @contextlib.contextmanager
    def active(self):
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def name(self, module: nnx.Module, point_name: str) -> str | None:
        path = self.paths.get(id(module))
        if path is None:
            return None
        name = f"{path}.{point_name}" if path else point_name
        self.seen[name] = None
        return name

    def replaces(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.hooks)

    def wants(self, name: str) -> bool:
        return self.replaces(name) or self.cached(name)

    def visit(self, module, point_name, value, batch=None):
        name = self.name(module, point_name)
        if name is None or not self.wants(name):
            return value
        shaped = value if batch is None else unflatten_batch(value, batch)
        context = _context(name, point_name)
        for pattern, fn in self.hooks.items():
            if fnmatch.fnmatchcase(name, pattern):
                new = jnp.asarray(fn(shaped, context))
                if new.shape != shaped.shape:
                    raise ValueError(
                        f"{name}: the hook returned shape {new.shape}, expected {shaped.shape}"
                    )
                shaped = new.astype(shaped.dtype)
        if self.cached(name):
            self.values[name], self.contexts[name] = shaped, context
        return shaped.reshape(value.shape)

    def check_names(self, names: NameFilter) -> None:
        """Each name or glob of ``names`` matched a point."""
        if names is None or callable(names):
            return
        for pattern in [names] if isinstance(names, str) else names:
            if not any(fnmatch.fnmatchcase(n, pattern) for n in self.seen):
                raise ValueError(
                    f"{pattern!r}: matches no hook point; the points: {list(self.seen)}"
                )


_ACTIVE: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("hooks", default=None)


def _filter(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    patterns = [names] if isinstance(names, str) else list(names)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _context(name: str, point_name: str) -> HookContext:
    parts = name.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    layer = None if index is None else int(parts[index])
    point_path = name if index is None else ".".join(parts[index + 1 :])
    return HookContext(name, point_path, layer, *AXES[point_name])
