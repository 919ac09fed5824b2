"""Sequence parallelism in NNX: ``MultiHeadAttention(sequence_parallel=...)``, ``ModelConfig``
and the example that trains a model sharded over 4 devices (subprocesses: 4 CPU devices)."""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnjax.nn import ModelConfig, MultiHeadAttention
from attnjax.sharded import SequenceParallel
from tests.cpu import subprocess_env

ROOT = pathlib.Path(__file__).parents[2]
FOUR = subprocess_env(4, PYTHONPATH=str(ROOT))
SCRIPT = """
import dataclasses, jax, numpy as np
from flax import nnx
from attnjax.nn import MultiHeadAttention, mods
from attnjax.sharded import SequenceParallel
x = jax.random.normal(jax.random.key(0), (2, 16, 32))
for score in ("scaled_dot", "additive"):
    kw = dict(num_kv_heads=2, score=score, rope=True, score_mod=mods.ALiBi(4, learnable=True,
              rngs=nnx.Rngs(2)))
    one = MultiHeadAttention(4, 32, rngs=nnx.Rngs(1), **kw)
    four = MultiHeadAttention(4, 32, rngs=nnx.Rngs(1), sequence_parallel=SequenceParallel.over(4),
                              **kw)
    loss = lambda m: (m(x, is_causal=True) ** 2).sum()
    (l1, g1), (l4, g4) = (nnx.value_and_grad(loss)(m) for m in (one, four))
    err = max(float(np.max(np.abs(a - b))) / float(np.max(np.abs(a)))
              for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)))
    print(score, abs(float(l1 - l4)) / abs(float(l1)), err)
"""


def test_multi_head_attention_sharded_matches_one_device():
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=FOUR, capture_output=True,
                            text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for line in result.stdout.strip().splitlines():
        _, loss_error, grad_error = line.split()
        assert float(loss_error) <= 1e-5 and float(grad_error) <= 1e-4, line


def test_example_trains_to_the_same_loss_curve(tmp_path):
    command = [sys.executable, "examples/sequence_parallel.py", "--steps", "8", "--out",
               str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, env=FOUR, capture_output=True, text=True, timeout=600,
                            cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = np.loadtxt(tmp_path / "losses.csv", delimiter=",", skiprows=1)
    assert rows.shape == (8, 4) and (tmp_path / "loss.png").is_file()
    np.testing.assert_allclose(rows[:, 1], rows[:, 2], atol=1e-5)
    assert rows[-1, 1] < rows[0, 1]  # it trains


def test_settings_are_checked():
    with pytest.raises(ValueError, match="sequence shards: expected 1 to"):
        SequenceParallel.over(len(jax.devices()) + 1)
    with pytest.raises(ValueError, match="sequence_strategy"):
        ModelConfig(vocab_size=8, sequence_strategy="ulysses")
    with pytest.raises(ValueError, match=r"sequence_shards: .* no attention dropout"):
        ModelConfig(vocab_size=8, sequence_shards=1, dropout=0.1)
    with pytest.raises(ValueError, match="layout: expected one of"):
        SequenceParallel.over(1, layout="striped")
    mha = MultiHeadAttention(2, 8, sequence_parallel=SequenceParallel.over(1), rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (1, 4, 8))
    with pytest.raises(ValueError, match="forms no attention weights"):
        mha(x, return_weights=True)
    plain = MultiHeadAttention(2, 8, rngs=nnx.Rngs(0))
    mask = jnp.array([[1, 0, 0, 0], [1, 1, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]], bool)[None, None]
    np.testing.assert_allclose(mha(x, is_causal=True), plain(x, is_causal=True), atol=1e-6)
    np.testing.assert_allclose(mha(x, mask=mask), plain(x, mask=mask), atol=1e-6)
