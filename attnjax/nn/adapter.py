"""``attention_fn``: attnjax scores inside ``flax.nnx.MultiHeadAttention``."""

from collections.abc import Callable
from typing import Any

from flax import nnx
from jaxtyping import Array, Float

from attnjax.attention import attention
from attnjax.nn.attention import DENSE, dropout_weights, weighted_sum
from attnjax.nn.batching import flatten_batch, unflatten_batch


def attention_fn(score: str | Callable = "scaled_dot", **options: Any) -> Callable[..., Array]:
    """An ``attention_fn`` for ``flax.nnx.MultiHeadAttention(attention_fn=...)`` that runs
    :func:`attnjax.attention` with ``score`` and ``options`` (its keywords: ``score_params``,
    ``temperature``, ``implementation``, mods, ``local_window_size`` ...).

    It takes Flax's arguments: ``bias``, ``mask``, ``is_causal``, dropout (``dropout_rng``,
    ``dropout_rate``, ``broadcast_dropout``, ``deterministic``: dropped weights, as Flax draws
    them), ``module`` (sows ``"attention_weights"`` before dropout, as Flax does) and ``dtype``
    (of the output); any leading batch dimensions (``[batch..., length, heads, features]``),
    none included. Dropout and sowing run on the dense path. Score parameters are fixed
    values here: for learnable ones use :class:`attnjax.nn.MultiHeadAttention`.
    """

    def fn(
        query: Float[Array, "*B T N H"],
        key: Float[Array, "*B S K H"],
        value: Float[Array, "*B S K Hv"],
        bias: Float[Array, "..."] | None = None,
        mask: Array | None = None,
        broadcast_dropout: bool = True,
        dropout_rng: Array | None = None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype: Any = None,
        precision: Any = None,
        module: nnx.Module | None = None,
        promote_dtype: Any = None,
        is_causal: bool = False,
    ) -> Float[Array, "*B T N Hv"]:
        del precision, promote_dtype  # attnjax computes in float32
        batch = query.shape[:-3]
        query, key, value = (x.reshape(-1, *x.shape[-3:]) for x in (query, key, value))
        mask = None if mask is None else flatten_batch(mask.astype(bool), batch, 3)
        bias = None if bias is None else flatten_batch(bias, batch, 3)
        dropout = dropout_rate > 0.0 and not deterministic
        dense = dropout or module is not None
        kwargs = {**options, "implementation": DENSE} if dense else options
        result = attention(query, key, value, bias, mask, is_causal=is_causal, score=score,
                           return_weights=dense, **kwargs)  # fmt: skip
        out, weights = result if dense else (result, None)
        if module is not None:
            module.sow(nnx.Intermediate, "attention_weights", unflatten_batch(weights, batch))
        if dropout:
            out = weighted_sum(
                dropout_weights(weights, dropout_rng, dropout_rate, broadcast_dropout), value
            )
        return unflatten_batch(out, batch).astype(dtype or query.dtype)

    return fn
