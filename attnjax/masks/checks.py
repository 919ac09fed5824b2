"""Checks on score and mask mods: their signature, what they close over, equality by value, and
errors raised while a mod runs, each reported in one message that names the mod.

A mod is compared by value (:func:`same_mod`): two functions are the same mod when they share
their code and their defaults and closed-over values are the same (mods compared recursively),
so ``mods.document()`` built twice is one mod.
"""

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

SIGNATURES = {
    "score_mod": "(logits, b, h, q_idx, kv_idx, params)",
    "mask_mod": "(b, h, q_idx, kv_idx, params)",
}


def check_signature(name: str, mod: Callable) -> None:
    """``mod`` takes the arguments of ``name`` (``"score_mod"`` or ``"mask_mod"``)."""
    expected = SIGNATURES[name]
    try:
        signature = inspect.signature(mod)
    except (TypeError, ValueError):
        return  # builtins and some callables have none to inspect
    try:
        signature.bind(*range(expected.count(",") + 1))
    except TypeError:
        raise TypeError(
            f"{name}: expected a function {expected}, got {_name(mod)}{signature}"
        ) from None


def check_closure(name: str, mod: Callable, *, arrays: bool = False) -> None:
    """``mod`` closes over no traced value (and with ``arrays``, no array at all: Pallas
    kernels cannot capture constants); data and parameters travel as ``mod_params``."""
    for where, value in _closed_over(mod):
        traced = isinstance(value, jax.core.Tracer)
        if traced or (arrays and isinstance(value, jax.Array | np.ndarray) and np.ndim(value)):
            kind = "a traced value" if traced else "an array"
            raise ValueError(
                f"{name}: {_name(mod)} closes over {kind} ({where}); pass it as "
                f"mod_params={{...}} and read it from the mod's params argument "
                f"{SIGNATURES[name]}"
            )


def _closed_over(fn: Any, seen: set[int] | None = None) -> Iterator[tuple[str, Any]]:
    """``(variable, value)`` for every value ``fn`` closes over, through nested mods,
    ``functools.partial`` and containers."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        values = [("partial argument", v) for v in (*fn.args, *fn.keywords.values())]
        values.append(("partial function", fn.func))
    elif inspect.isfunction(fn):
        cells = fn.__closure__ or ()
        names = fn.__code__.co_freevars
        values = [(n, _cell(c)) for n, c in zip(names, cells, strict=True)]
        values += [("a default", v) for v in (fn.__defaults__ or ())]
    else:
        return
    for where, value in values:
        for item in _items(value):
            if callable(item) and not isinstance(item, jax.Array):
                yield from _closed_over(item, seen)
            else:
                yield where, item


def _items(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _items(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _items(v)]
    return [value]


def _cell(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later)
        return None


def same_mod(a: Any, b: Any) -> bool:
    """Whether two mods compute the same thing: the same object, or functions with the same
    code whose defaults and closed-over values are equal (arrays by value)."""
    if a is b:
        return True
    a, b = inspect.unwrap(a), inspect.unwrap(b)  # decorators (runtime type checkers) aside
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return same_value((a.func, a.args, a.keywords), (b.func, b.args, b.keywords))
    if not (inspect.isfunction(a) and inspect.isfunction(b)):
        return False
    return (
        a.__code__ == b.__code__
        and a.__globals__ is b.__globals__
        and same_value(a.__defaults__, b.__defaults__)
        and same_value(a.__kwdefaults__, b.__kwdefaults__)
        and same_value(
            [_cell(c) for c in a.__closure__ or ()], [_cell(c) for c in b.__closure__ or ()]
        )
    )


def same_value(a: Any, b: Any) -> bool:
    """Equality by value for mods, containers and arrays; traced arrays only by identity."""
    if a is b:
        return True
    if callable(a) and not isinstance(a, jax.Array):
        return same_mod(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    arrays = (jax.Array, np.ndarray, np.generic)
    if isinstance(a, arrays) or isinstance(b, arrays):
        if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
            return False
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


_EXPLAINED = (IndexError, TypeError, ValueError, KeyError, AttributeError)


def read_paths(mask_mod: Callable, params: Any, indices: tuple) -> list[Any]:
    """The key paths of the leaves of ``params`` that ``mask_mod(*indices, params)`` reads
    (found by tracing it once: a leaf no operation uses is not read)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    if not flat:
        return []
    paths, leaves = zip(*flat, strict=True)
    shapes = [jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x)) for x in leaves]

    def mask(*leaves):
        return mask_mod(*indices, jax.tree.unflatten(treedef, leaves))

    jaxpr = jax.make_jaxpr(mask)(*shapes).jaxpr
    used = {v for v in jaxpr.outvars if not hasattr(v, "val")}  # literals have a value
    for eqn in reversed(jaxpr.eqns):
        if any(v in used for v in eqn.outvars):
            used.update(v for v in eqn.invars if not hasattr(v, "val"))
    return [p for p, v in zip(paths, jaxpr.invars, strict=True) if v in used]


BATCH_HINT = (
    ". Indices broadcast to [B, N, T, S]; for unbatched inputs b is 0, so per-batch data "
    "keeps a batch axis of 1"
)


def run_mod(name: str, mod: Callable, args: tuple, params: Any, hint: str = BATCH_HINT) -> Any:
    """``mod(*args, params)``; a plain Python error it raises (not JAX's own, which explain
    themselves) is re-raised naming the mod, the shapes of the arguments it got and of
    ``params``, and ``hint``."""
    try:
        return mod(*args, params)
    except _EXPLAINED as error:
        if type(error) not in _EXPLAINED:
            raise
        shapes = jax.tree.map(np.shape, params)
        got = ", ".join(str(np.shape(x)) for x in args)
        raise type(error)(
            f"{name}: {_name(mod)} failed on arguments of shapes {got} and mod_params of "
            f"shapes {shapes} ({type(error).__name__}: {error}){hint}"
        ) from error


def _name(mod: Any) -> str:
    return getattr(mod, "__qualname__", None) or repr(mod)
