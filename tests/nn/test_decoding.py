"""Autoregressive decoding: key/value caches (``init_cache``, ``decode=True``) and
``generate``, against the full forward pass recomputed at every step, and against Flax."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from flax import nnx

from attnjax import nn

CONFIG = nn.ModelConfig(width=32, layers=2, heads=4, vocab_size=13, num_classes=13, causal=True,
                        positional="rope")  # fmt: skip
PROMPT = jax.random.randint(jax.random.key(1), (2, 5), 0, 13)


def _greedy_by_recomputing(model, prompt, steps):
    tokens = prompt
    for _ in range(steps):
        next_token = jnp.argmax(model({"inputs": tokens})[:, -1], axis=-1)
        tokens = jnp.concatenate([tokens, next_token[:, None].astype(tokens.dtype)], axis=1)
    return tokens


@pytest.mark.parametrize(
    "changes",
    [{"score": s} for s in ("scaled_dot", "dot", "bilinear", "additive", "cosine")]
    + [{"kv_heads": 1}, {"kv_heads": 2, "positional": "learned"}, {"score_mod": "alibi"}],
)
def test_cached_greedy_decoding_equals_recomputing_the_full_forward(changes):
    model = nn.build(dataclasses.replace(CONFIG, **changes), nnx.Rngs(0))
    cached = nn.generate(model, PROMPT, 7, key=jax.random.key(2), temperature=0)
    np.testing.assert_array_equal(cached, _greedy_by_recomputing(model, PROMPT, 7))


def test_decoding_one_token_at_a_time_equals_flax():
    """Flax's module and ours with Flax's weights, both decoding from their caches."""
    kw = {"num_kv_heads": 2, "normalize_qk": True, "decode": True}
    ref = nnx.MultiHeadAttention(4, 16, 24, rngs=nnx.Rngs(1), **kw)
    ours = nn.MultiHeadAttention(4, 16, 24, rngs=nnx.Rngs(1), **kw)
    nnx.update(ours, nnx.state(ref, nnx.Param))
    x = jax.random.normal(jax.random.key(3), (2, 6, 16))
    for module in (ref, ours):
        module.init_cache(x.shape)
    for t in range(6):
        np.testing.assert_allclose(ours(x[:, t : t + 1]), ref(x[:, t : t + 1]), atol=1e-5)
    full = nn.MultiHeadAttention(4, 16, 24, rngs=nnx.Rngs(1), num_kv_heads=2, normalize_qk=True)
    nnx.update(full, nnx.state(ref, nnx.Param))
    np.testing.assert_allclose(ours(x[:, :1], decode=False), full(x[:, :1]), atol=1e-6)


def test_a_long_prompt_fills_the_cache_on_the_tiled_path(monkeypatch):
    calls = []
    dispatch = importlib.import_module("attnjax.attention").IMPLEMENTATIONS
    chunked = dispatch["chunked"]

    def recording(query, key, value, call):
        calls.append((query.shape[1], key.shape[1]))
        return chunked(query, key, value, call)

    monkeypatch.setitem(dispatch, "chunked", recording)
    model = nn.build(dataclasses.replace(CONFIG, layers=1), nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(4), (1, 512), 0, 13)
    cached = nn.generate(model, prompt, 2, key=jax.random.key(5), temperature=0)
    assert (512, 514) in calls  # 512 x 514 logits: at or above the chunked threshold
    np.testing.assert_array_equal(cached, _greedy_by_recomputing(model, prompt, 2))


def test_sampling_settings():
    model = nn.build(CONFIG, nnx.Rngs(0))
    greedy = nn.generate(model, PROMPT, 5, key=jax.random.key(6), temperature=0)
    np.testing.assert_array_equal(
        nn.generate(model, PROMPT, 5, key=jax.random.key(7), top_k=1), greedy
    )
    drawn = [
        nn.generate(model, PROMPT, 5, key=jax.random.key(k), temperature=2.0) for k in (8, 8, 9)
    ]
    np.testing.assert_array_equal(drawn[0], drawn[1])
    assert not np.array_equal(drawn[0], drawn[2])
    np.testing.assert_array_equal(drawn[0][:, :5], PROMPT)


def test_decoding_errors():
    mha = nn.MultiHeadAttention(2, 8, decode=True, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 1, 8))
    with pytest.raises(ValueError, match="init_cache first"):
        mha(x)
    mha.init_cache((1, 4, 8))
    with pytest.raises(ValueError, match="self-attention"):
        mha(x, x)
    with pytest.raises(ValueError, match="query_seq_lengths: not taken while decoding"):
        mha(x, query_seq_lengths=jnp.array([1]))
    learned = nn.build(dataclasses.replace(CONFIG, positional="learned", max_len=8), nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_len=8"):
        nn.generate(learned, PROMPT, 4, key=jax.random.key(0))
    with pytest.raises(ValueError, match="not causal"):
        nn.generate(nn.build(dataclasses.replace(CONFIG, causal=False), nnx.Rngs(0)), PROMPT, 2,
                    key=jax.random.key(0))  # fmt: skip
    with pytest.raises(ValueError, match="positions: decoding needs"):
        nn.build(CONFIG, nnx.Rngs(0))({"inputs": PROMPT}, decode=True)
    with pytest.raises((ValueError, jaxtyping.TypeCheckError), match="prompt"):
        nn.generate(nn.build(CONFIG, nnx.Rngs(0)), jnp.ones((3,), jnp.int32), 2,
                    key=jax.random.key(0))  # fmt: skip


def test_generate_refuses_models_whose_predictions_are_not_next_tokens():
    copy_like = dataclasses.replace(CONFIG, vocab_size=10, num_classes=8)  # the copy task's sizes
    prompt = PROMPT % 10
    with pytest.raises(
        ValueError, match=r"num_classes=8 classes but reads vocab_size=10 tokens \(built for a task"
    ):
        nn.generate(nn.build(copy_like, nnx.Rngs(0)), prompt, 2, key=jax.random.key(0))
    for config, task in [
        (dataclasses.replace(copy_like, task="copy", next_token=False), "copy"),
        (dataclasses.replace(CONFIG, task="mqar", next_token=False), "mqar"),  # classes = vocab
    ]:
        with pytest.raises(ValueError, match=f"built for task '{task}', which is not next-token"):
            nn.generate(nn.build(config, nnx.Rngs(0)), prompt, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompt: token ids must be in \[0, vocab_size=13\)"):
        nn.generate(nn.build(CONFIG, nnx.Rngs(0)), PROMPT.at[0, 0].set(13), 2,
                    key=jax.random.key(0))  # fmt: skip
