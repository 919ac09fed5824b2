"""``generate``: autoregressive sampling from a token model with key/value caches."""

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Int, PRNGKeyArray

from attnjax.nn.attention import MultiHeadAttention
from attnjax.nn.models import check_tokens
from attnjax.nn.positional import Learned


def generate(
    model: nnx.Module,
    prompt: Int[Array, "B P"],
    max_new_tokens: int,
    *,
    key: PRNGKeyArray,
    temperature: float | int = 1.0,
    top_k: int | None = None,
) -> Int[Array, "B L"]:
    """``prompt`` followed by ``max_new_tokens`` sampled tokens, ``[B, P + max_new_tokens]``.

    ``model`` maps ``{"inputs": int[B, T], "positions": int[B, T]}`` to logits ``[B, T, V]``
    and takes ``decode=`` and ``deterministic=`` (:class:`attnjax.nn.Transformer`, causal).
    Every :class:`MultiHeadAttention` in it gets a cache for ``P + max_new_tokens`` positions
    (on a copy: ``model`` is not changed); the prompt runs in one call (a long one on the tiled
    path), then one token per step, all in one ``jax.jit`` (one compile per shape and
    setting). Tokens are drawn from ``softmax(logits / temperature)``, restricted to the
    ``top_k`` most likely when given; ``temperature=0`` is greedy (argmax).

    Each prediction is fed back as the next input, so the model must be a next-token model:
    one whose config records a task that is not next-token prediction
    (``ModelConfig(task=..., next_token=False)``) is refused with the task's name, and so is
    one whose classes are not its vocabulary (``num_classes != vocab_size``, as for the copy
    task, whatever it records). Prompt ids must lie in ``[0, vocab_size)``.
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt: expected int [B, P] with P >= 1, got shape {prompt.shape}")
    if max_new_tokens < 1 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(
            f"expected max_new_tokens >= 1, temperature >= 0, top_k >= 1 or None; got "
            f"{max_new_tokens}, {temperature}, {top_k}"
        )
    if not any(isinstance(m, MultiHeadAttention) for _, m in nnx.iter_modules(model)):
        raise ValueError("model: has no attnjax.nn.MultiHeadAttention to cache")
    if getattr(model, "causal", True) is False:
        raise ValueError("model: is not causal; autoregressive decoding needs a causal model")
    _check_next_token(model)
    vocab_size = getattr(model, "vocab_size", None)
    if vocab_size is not None:
        check_tokens(prompt, vocab_size, "prompt")
    total = prompt.shape[1] + max_new_tokens
    for _, table in nnx.iter_modules(model):
        if isinstance(table, Learned) and total > table.max_len:
            raise ValueError(
                f"max_new_tokens: prompt and new tokens ({total}) exceed the learned positional "
                f"table's max_len={table.max_len}"
            )
    graphdef, state = nnx.split(model)
    greedy = temperature == 0
    return _generate(graphdef, state, prompt, key, jnp.float32(temperature or 1.0),
                     max_new_tokens, greedy, top_k)  # fmt: skip


def _check_next_token(model: nnx.Module) -> None:
    """``ValueError`` unless ``model``'s predictions can be its next inputs: its recorded task
    is not declared other than next-token, and its classes are its vocabulary."""
    task = getattr(model, "task", None)
    named = f"task {task!r}" if task else "a task not recorded"
    if getattr(model, "next_token", None) is False:
        raise ValueError(
            f"model: built for {named}, which is not next-token prediction; generate feeds "
            "each prediction back as the next input"
        )
    classes, vocab = getattr(model, "num_classes", None), getattr(model, "vocab_size", None)
    if classes is not None and classes != vocab:
        reads = f"vocab_size={vocab} tokens" if vocab is not None else "float features"
        raise ValueError(
            f"model: predicts num_classes={classes} classes but reads {reads} (built for "
            f"{named}), so its predictions are not next tokens; generate needs num_classes == "
            "vocab_size"
        )


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7))
def _generate(graphdef, state, prompt, key, temperature, max_new_tokens, greedy, top_k):
    model = nnx.merge(graphdef, state)
    batch, length = prompt.shape
    total = length + max_new_tokens
    for _, layer in nnx.iter_modules(model):
        if isinstance(layer, MultiHeadAttention):
            dtype = layer.query.dtype or layer.query.param_dtype
            layer.init_cache((batch, total, layer.in_features), dtype)

    def logits(model, tokens, start):
        positions = jnp.broadcast_to(start + jnp.arange(tokens.shape[1]), tokens.shape)
        batch = {"inputs": tokens, "positions": positions}
        return model(batch, decode=True, deterministic=True)[:, -1].astype(jnp.float32)

    def draw(logits, key):
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits = logits / temperature
        if top_k is not None:
            kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
        return jax.random.categorical(key, logits).astype(jnp.int32)

    keys = jax.random.split(key, max_new_tokens)
    tokens = jnp.zeros((batch, total), jnp.int32).at[:, :length].set(prompt)
    tokens = tokens.at[:, length].set(draw(logits(model, prompt, 0), keys[0]))
    graphdef, state = nnx.split(model)

    def step(i, carry):
        state, tokens = carry
        model = nnx.merge(graphdef, state)
        last = length + i - 1
        token = jax.lax.dynamic_slice_in_dim(tokens, last, 1, axis=1)
        drawn = draw(logits(model, token, last), keys[i])
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, drawn[:, None], last + 1, axis=1)
        return nnx.state(model), tokens

    return jax.lax.fori_loop(1, max_new_tokens, step, (state, tokens))[1]
