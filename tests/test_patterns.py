"""``attnjax.patterns.attention_rows``: weights of chosen rows and heads recomputed from the
log-sum-exp of the chunked, Pallas (interpret mode on CPU) and sequence-parallel paths equal
the dense weights; their compiled memory is O(rows × S) at T = S = 32768; the full pattern of
a long sequence is refused with a pointer to ``rows=``.

The sequence-parallel case runs ``python -m tests.test_patterns`` on 4 CPU devices (the device
count is fixed when JAX starts), which prints its errors as one JSON line.
"""

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
from attnjax import mods
from attnjax.patterns import FULL_PATTERN_MAX_LOGITS, attention_rows
from attnjax.tiling import BlockSizes
from tests.cpu import subprocess_env

ROOT = pathlib.Path(__file__).parents[1]
B, T, S, N, K, H, A = 2, 24, 40, 4, 2, 8, 6
ROWS = jnp.array([0, 5, 17, 23])  # 17: not a tile start; 23: the last row
HEADS = jnp.array([3, 0])
SLOPES = {"slopes": jnp.array([0.5, 0.25, 0.125, 0.0625])}


def _inputs(seed=0, num_queries=T, num_keys=S):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (B, num_queries, N, H)),
        jax.random.normal(kk, (B, num_keys, K, H)),
        jax.random.normal(kv, (B, num_keys, K, H)),
    )


def _additive():
    ks = jax.random.split(jax.random.key(7), 3)
    return {
        "w_q": jax.random.normal(ks[0], (N, H, A)) / 3,  # per head: sliced for the chosen heads
        "w_k": jax.random.normal(ks[1], (H, A)) / 3,
        "v": jax.random.normal(ks[2], (A,)),
    }


CASES = {
    # GQA in every case (N = 4 query heads on K = 2 key heads)
    "causal_offset_window": {
        "is_causal": True,
        "causal_offset": S - T,
        "local_window_size": (9, 0),
    },
    "alibi_params_temperature": {
        "is_causal": True,
        "causal_offset": S - T,
        "score_mod": mods.alibi(param="slopes"),
        "mod_params": SLOPES,
        "temperature": jnp.array([0.5, 1.0, 2.0, 3.0])[:, None, None],
    },
    "additive_lengths": {
        "score": "additive",
        "score_params": _additive(),
        "key_value_seq_lengths": jnp.array([S, 11]),
        "query_seq_lengths": jnp.array([T, 20]),  # batch 1, rows 20...: empty rows, weights 0
    },
}
PALLAS = ["causal_offset_window", "alibi_params_temperature", "additive_lengths"]


def _error(implementation, case, heads):
    q, k, v = _inputs()
    kwargs = CASES[case]
    _, dense = aj.attention(q, k, v, implementation="xla", return_weights=True, **kwargs)
    _, lse = aj.attention(
        q,
        k,
        v,
        implementation=implementation,
        block_sizes=BlockSizes(8, 16),
        return_lse=True,
        **kwargs,
    )
    got = attention_rows(q, k, lse, ROWS, heads=heads, **kwargs)
    expected = dense[:, :, ROWS]
    if heads is not None:
        expected = expected[:, heads]
    assert got.shape == expected.shape
    return float(jnp.max(jnp.abs(got - expected)))


@pytest.mark.parametrize("heads", [None, HEADS], ids=["all_heads", "heads_3_0"])
@pytest.mark.parametrize("case", list(CASES))
def test_chunked_rows_equal_dense_weights(case, heads):
    assert _error("chunked", case, heads) <= 1e-5


@pytest.mark.parametrize("case", PALLAS)
def test_pallas_rows_equal_dense_weights(case):
    assert _error("pallas", case, HEADS) <= 1e-5


def test_callable_score_bias_mask_and_mask_mod_on_chosen_heads():
    """A callable score (opaque parameters: all heads evaluated, then taken), a per-head bias
    and dense mask (their rows and heads taken), a mask mod seeing the original head index."""
    q, k, v = _inputs(1)
    bias = jax.random.normal(jax.random.key(3), (N, T, S))
    mask = jax.random.bernoulli(jax.random.key(4), 0.8, (B, 1, T, S))
    kwargs = {
        "score": lambda q, k, p: jnp.einsum("bnth,bnsh->bnts", q, k) * p["s"][None, :, None, None],
        "score_params": {"s": jnp.array([0.1, 0.2, 0.3, 0.4])},
        "mask_mod": lambda b, h, q_idx, kv_idx, p: (kv_idx + h) % 3 != 0,
    }
    _, dense = aj.attention(q, k, v, bias, mask, return_weights=True, **kwargs)
    _, lse = aj.attention(q, k, v, bias, mask, implementation="chunked", return_lse=True, **kwargs)
    got = attention_rows(q, k, lse, ROWS, bias, mask, heads=HEADS, **kwargs)
    assert float(jnp.max(jnp.abs(got - dense[:, HEADS][:, :, ROWS]))) <= 1e-5
    named = {"mask_mod": kwargs["mask_mod"], "score_params": {"scale": jnp.asarray(0.3)}}
    _, dense = aj.attention(q, k, v, bias, mask, return_weights=True, **named)
    _, lse = aj.attention(q, k, v, bias, mask, implementation="chunked", return_lse=True, **named)
    got = attention_rows(q, k, lse, ROWS, bias, mask, heads=HEADS, **named)
    assert float(jnp.max(jnp.abs(got - dense[:, HEADS][:, :, ROWS]))) <= 1e-5


def test_unbatched_all_rows_and_traced_rows():
    q, k, v = (x[0] for x in _inputs(2))
    kwargs = CASES["causal_offset_window"]
    _, dense, lse = aj.attention(q, k, v, return_weights=True, return_lse=True, **kwargs)
    got = attention_rows(q, k, lse, None, **kwargs)  # T · S is small: the full pattern
    assert got.shape == (N, T, S) and float(jnp.max(jnp.abs(got - dense))) <= 1e-5
    jitted = jax.jit(functools.partial(attention_rows, **kwargs))
    got = jitted(q, k, lse, ROWS, heads=HEADS)
    assert float(jnp.max(jnp.abs(got - dense[HEADS][:, ROWS]))) <= 1e-5


def test_errors():
    q, k, v = _inputs()
    _, lse = aj.attention(q, k, v, implementation="chunked", return_lse=True)
    with pytest.raises(ValueError, match=r"rows: expected values in \[0, T\)"):
        attention_rows(q, k, lse, jnp.array([T]))
    with pytest.raises(ValueError, match="heads: expected values"):
        attention_rows(q, k, lse, ROWS, heads=jnp.array([N]))
    with pytest.raises(ValueError, match="lse: expected the log-sum-exp"):
        attention_rows(q, k, jnp.swapaxes(lse, 1, 2), ROWS)
    with pytest.raises(TypeError):
        attention_rows(q, k, lse, ROWS, not_a_keyword=1)
    long = jax.ShapeDtypeStruct((1, 8192, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"rows=None asks for the full .*pass rows="):
        jax.eval_shape(
            lambda q, k, lse: attention_rows(q, k, lse, None, is_causal=True),
            long,
            long,
            jax.ShapeDtypeStruct((1, 1, 8192), jnp.float32),
        )
    assert 8192 * 8192 > FULL_PATTERN_MAX_LOGITS


MEMORY_T = 32768
MEMORY_HEADS, MEMORY_KV, MEMORY_H = 4, 2, 16


def _temp_bytes(num_rows, heads, **kwargs):
    """Compiled temporary memory of ``attention_rows`` at ``T = S = 32768``."""
    t = MEMORY_T
    shape = jax.ShapeDtypeStruct
    f = jax.jit(functools.partial(attention_rows, heads=heads, **kwargs))
    compiled = f.lower(
        shape((1, t, MEMORY_HEADS, MEMORY_H), jnp.float32),
        shape((1, t, MEMORY_KV, MEMORY_H), jnp.float32),
        shape((1, MEMORY_HEADS, t), jnp.float32),
        shape((num_rows,), jnp.int32),
    ).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("heads", [None, jnp.array([1, 2])], ids=["all_heads", "two_heads"])
def test_memory_is_rows_times_keys_at_32k(heads):
    """Temporaries: the chosen rows' logits and mask (O(M · R · S)) and one copy of the
    chosen heads' keys (O(M · S · H), the size of the input); never T × S (4 GiB here).
    Measured on CPU: 12.6 MB (all 4 heads) and 6.3 MB (2 heads) at 8 rows."""
    t = s = MEMORY_T
    heads_n = MEMORY_HEADS if heads is None else len(heads)
    kwargs = {"is_causal": True, "local_window_size": (1024, 0), "score_mod": mods.alibi(4)}
    few, more = _temp_bytes(8, heads, **kwargs), _temp_bytes(64, heads, **kwargs)
    print(f"temp bytes at T = S = {t}, {heads_n} heads: 8 rows {few}, 64 rows {more}")
    row_bytes = heads_n * s * 4  # one float32 row of logits for every chosen head
    keys = heads_n * s * MEMORY_H * 4
    assert few <= 4 * (8 * row_bytes + keys)
    assert more <= 4 * (64 * row_bytes + keys)
    assert more - few <= 4 * (64 - 8) * row_bytes  # grows linearly in the rows
    assert more < t * s * 4 / 100


def test_sequence_parallel_rows_equal_dense_weights():
    env = subprocess_env(4, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "tests.test_patterns"], env=env,
                            capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(errors) == {"ring/causal_offset_window", "ring/alibi_params_temperature",
                           "all_gather/alibi_params_temperature"}  # fmt: skip
    for name, error in errors.items():
        assert error <= 1e-5, (name, error)


def _sequence_parallel_errors() -> dict[str, float]:
    """On the 4 devices of this process: ``ring_attention``'s lse, rows recomputed."""
    import numpy as np

    from attnjax.sharded import ring_attention

    assert len(jax.devices()) == 4
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seq",))
    q, k, v = _inputs(5, T, T)  # T = 24: a multiple of 2P = 8 (the zigzag layout)
    errors = {}
    for strategy, case in [("ring", "causal_offset_window"),
                           ("ring", "alibi_params_temperature"),
                           ("all_gather", "alibi_params_temperature")]:  # fmt: skip
        kwargs = {**CASES[case], "causal_offset": 3}
        _, lse = ring_attention(
            q, k, v, mesh=mesh, axis="seq", strategy=strategy, return_lse=True, **kwargs
        )
        _, dense = aj.attention(q, k, v, implementation="xla", return_weights=True, **kwargs)
        got = attention_rows(q, k, lse, ROWS, heads=HEADS, **kwargs)
        errors[f"{strategy}/{case}"] = float(jnp.max(jnp.abs(got - dense[:, HEADS][:, :, ROWS])))
    return errors


if __name__ == "__main__":
    print(json.dumps(_sequence_parallel_errors()))
