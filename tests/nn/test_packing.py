"""Packed and padded batches: a packed row gives each sequence's outputs as if it ran alone,
and padding beyond ``lengths`` changes nothing before it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax as aj
from attnjax import nn

CONFIG = nn.ModelConfig(width=32, layers=2, heads=4, kv_heads=2, vocab_size=11, num_classes=11,
                        max_len=32)  # fmt: skip
ROWS = [[5, 7, 4], [9, 7]]  # two packed rows of 16 positions


def _sequences(key):
    keys = jax.random.split(key, sum(len(r) for r in ROWS))
    lengths = [n for row in ROWS for n in row]
    return [jax.random.randint(k, (n,), 0, 11) for k, n in zip(keys, lengths, strict=True)]


def _packed(sequences):
    """The rows of ROWS packed: inputs, segment ids and positions restarting per segment."""
    rows, it = [], iter(sequences)
    for row in ROWS:
        parts = [next(it) for _ in row]
        rows.append({
            "inputs": jnp.concatenate(parts),
            "segment_ids": jnp.concatenate([jnp.full(len(p), i) for i, p in enumerate(parts)]),
            "positions": jnp.concatenate([jnp.arange(len(p)) for p in parts]),
        })  # fmt: skip
    return jax.tree.map(lambda *x: jnp.stack(x), *rows)


@pytest.mark.parametrize(
    ("positional", "causal", "implementation"),
    [("rope", True, None), ("learned", False, "chunked"), ("sinusoidal", True, "xla")],
)
def test_a_packed_row_equals_its_sequences_run_alone(positional, causal, implementation):
    config = dataclasses.replace(CONFIG, positional=positional, causal=causal,
                                 implementation=implementation)  # fmt: skip
    model = nn.build(config, nnx.Rngs(0))
    sequences = _sequences(jax.random.key(1))
    packed = model(_packed(sequences))
    starts = [s for row in ROWS for s in np.cumsum([0, *row[:-1]])]
    rows = [b for b, row in enumerate(ROWS) for _ in row]
    for seq, b, start in zip(sequences, rows, starts, strict=True):
        alone = model({"inputs": seq[None]})[0]
        np.testing.assert_allclose(packed[b, start : start + len(seq)], alone, atol=2e-5)


def test_packed_attention_skips_tiles_and_matches():
    """The chunked path with 4x4 tiles on a packed row: equal to each sequence alone."""
    mha = nn.MultiHeadAttention(4, 32, rope=True, implementation="chunked", rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (2, 16, 32))
    packed = _packed(_sequences(jax.random.key(3)))
    ids = packed["segment_ids"]
    out = mha(x, is_causal=True, positions=packed["positions"], block_sizes=aj.BlockSizes(4, 4),
              q_segment_ids=ids, kv_segment_ids=ids)  # fmt: skip
    for b, row in enumerate(ROWS):
        for start, n in zip(np.cumsum([0, *row[:-1]]), row, strict=True):
            alone = mha(x[b : b + 1, start : start + n], is_causal=True)
            np.testing.assert_allclose(out[b : b + 1, start : start + n], alone, atol=2e-5)


def test_padding_beyond_lengths_changes_nothing_before():
    model = nn.build(dataclasses.replace(CONFIG, positional="rope"), nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(4), (2, 12), 0, 11)
    lengths = jnp.array([7, 12])
    garbage = tokens.at[0, 7:].set(3)
    padded = model({"inputs": garbage, "lengths": lengths})
    np.testing.assert_allclose(padded[0, :7], model({"inputs": tokens[:1, :7]})[0], atol=2e-5)
    np.testing.assert_allclose(padded[1], model({"inputs": tokens[1:]})[0], atol=2e-5)
