"""Head detectors: previous-token, duplicate-token and induction scores of every (layer,
head) from the attention patterns of a batch, with TransformerLens's designated keys
averaged over the queries that have one (TransformerLens averages over every query: a perfect
induction head on tokens repeated twice scores 1 here, about 0.5 there), and the
batches of repeated random tokens that make induction heads visible."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from attnjax.inspect.patching import Table
from attnjax.nn.hooks import run_with_cache

Patterns = Float[Array, "*L B N T S"]


def previous_token_scores(patterns: Patterns) -> Float[Array, "*L N"]:
    """Mean attention of each head on the key just before its query: ``pattern[t, t - 1]``
    averaged over the batch and the queries ``t >= 1``. 1: a previous-token head."""
    t, s = jnp.arange(patterns.shape[-2]), jnp.arange(patterns.shape[-1])
    return _score(patterns, s[None] == t[:, None] - 1)


def duplicate_token_scores(patterns: Patterns, tokens: Int[Array, "B T"]) -> Float[Array, "*L N"]:
    """Mean attention of each head on the earlier keys holding its query's token: the sum of
    ``pattern[t, s]`` over ``s < t`` with ``tokens[s] == tokens[t]``, averaged over the batch
    and the queries that have such a key."""
    return _score(patterns, _duplicates(tokens))


def induction_scores(patterns: Patterns, tokens: Int[Array, "B T"]) -> Float[Array, "*L N"]:
    """Mean attention of each head on the keys that followed an earlier occurrence of its
    query's token: the sum of ``pattern[t, s]`` over ``1 <= s <= t`` with ``tokens[s - 1] ==
    tokens[t]`` (``s - 1 < t``), averaged over the batch and the queries that have such a
    key. On :func:`repeated_tokens`, the key ``t - P + 1`` of the second half."""
    dup = _duplicates(tokens)  # [B, T, S]: dup[t, s'] for s' < t
    return _score(patterns, jnp.pad(dup[:, :, :-1], ((0, 0), (0, 0), (1, 0))))


def repeated_tokens(key: Array, batch_size: int, length: int, vocab_size: int) -> Int[Array, "B T"]:
    """``[B, 2P]`` with ``P = length``: a random sequence of distinct tokens, twice (the
    natural input for induction: each second-half token's earlier occurrence is ``P`` back)."""
    if length > vocab_size:
        raise ValueError(f"length: at most vocab_size={vocab_size} distinct tokens, got {length}")
    return periodic_tokens(key, jnp.full((batch_size,), length), 2 * length, vocab_size)


def periodic_tokens(
    key: Array, periods: Int[Array, " B"], length: int, vocab_size: int
) -> Int[Array, "B T"]:
    """``[B, T]`` with ``T = length``: sequence ``b`` repeats ``periods[b]`` distinct random
    tokens (``1 <= periods[b] <= vocab_size``, not checked: the periods may be traced), so
    ``tokens[b, t] = tokens[b, t - periods[b]]``. :func:`repeated_tokens` is one period, twice."""
    keys = jax.random.split(key, periods.shape[0])
    draws = jax.vmap(lambda k: jax.random.permutation(k, vocab_size))(keys)  # [B, V]
    index = jnp.arange(length)[None] % periods[:, None]
    return jnp.take_along_axis(draws, index, axis=1).astype(jnp.int32)


def detect_heads(model: nnx.Module, batch: Any, **kwargs: Any) -> dict[str, Table]:
    """The three scores of every (layer, head) of ``model`` on ``batch`` (token ``inputs
    [B, T]``), from its cached patterns: ``{"previous-token": Table, "duplicate-token": ...,
    "induction": ...}``, each ``[L, N]``. ``kwargs`` go to :func:`run_with_cache`, less
    ``rows`` and ``heads``: the scores read every query and head of the full pattern."""
    for name in ("rows", "heads"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"{name}: not taken; detect_heads scores every query and head of the full pattern"
            )
    _, cache = run_with_cache(model, batch, names="*.attention.pattern", **kwargs)
    patterns, tokens = cache.stack("attention.pattern"), batch["inputs"]
    scores = {
        "previous-token": previous_token_scores(patterns),
        "duplicate-token": duplicate_token_scores(patterns, tokens),
        "induction": induction_scores(patterns, tokens),
    }
    labels = tuple(map(str, range(patterns.shape[0]))), tuple(map(str, range(patterns.shape[2])))
    return {
        kind: Table(values, f"{kind} score", ("layer", "head"), labels)
        for kind, values in scores.items()
    }


def _duplicates(tokens: Int[Array, "B T"]) -> Bool[Array, "B T T"]:
    """``[b, t, s]``: ``s < t`` holds ``tokens[b, t]``."""
    same = tokens[:, :, None] == tokens[:, None, :]
    return same & jnp.tril(jnp.ones(same.shape[1:], bool), -1)[None]


def _score(patterns: Patterns, keys: Bool[Array, "*#batch T S"]) -> Float[Array, "*L N"]:
    """The attention on the designated ``keys`` per query, averaged over the batch and the
    queries with at least one designated key."""
    keys = jnp.asarray(keys)
    keys = keys[:, None] if keys.ndim == 3 else keys  # [#B, 1, T, S] against [B, N, T, S]
    mass = (patterns * jax.lax.broadcast_to_rank(keys, patterns.ndim)).sum(-1)  # [*L, B, N, T]
    has = jnp.broadcast_to(keys.any(-1), mass.shape).astype(mass.dtype)
    return (mass * has).sum((-3, -1)) / has.sum((-3, -1))
