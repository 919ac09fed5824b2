"""Sequence-parallel attention on ``P`` CPU devices against ``attnjax.attention`` on one,
forward and gradients, for both strategies. Run as ``python -m tests.sharded.parity P`` (the
device count is fixed when JAX starts, so the tests run it in a subprocess); prints one JSON
line ``{"strategy/case": [forward error, gradient error]}``."""

import json
import pathlib
import subprocess
import sys

from tests.cpu import subprocess_env

ROOT = pathlib.Path(__file__).parents[2]


def errors(devices: int, extended: bool) -> dict[str, list[float]]:
    """The errors from a subprocess with ``devices`` CPU devices."""
    env = subprocess_env(devices, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tests.sharded.parity", str(devices)]
    result = subprocess.run(command + ["extended"] * extended, env=env, capture_output=True,
                            text=True, timeout=900, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _cases(devices: int, extended: bool):
    """``{name: (fixed keywords, differentiated keywords, (key, value))}``; 3 positions per
    zigzag chunk, not a multiple of any tile."""
    import jax
    import jax.numpy as jnp

    from attnjax import mods, scores
    from tests.parity import qkv

    batch, length, heads, kv_heads, head_dim, hidden = 2, 6 * devices, 4, 2, 8, 6
    q, k, v = qkv(0, batch, length, length, heads, kv_heads, head_dim)
    ks = jax.random.split(jax.random.key(1), 4)
    additive = {
        "w_q": jax.random.normal(ks[0], (heads, head_dim, hidden)) / 3,
        "w_k": jax.random.normal(ks[1], (head_dim, hidden)) / 3,
        "v": jax.random.normal(ks[2], (hidden,)),
    }
    cut = [5, length // 2 - 1, length - 5 - (length // 2 - 1)]
    segments = jnp.repeat(jnp.arange(3), jnp.array(cut))[None].repeat(batch, 0)
    table = jax.random.normal(ks[3], (heads, 8))
    kv = (k, v)
    cases = {
        "scaled_dot_causal_offset": ({"is_causal": True, "causal_offset": 3}, {}, kv),
        "additive_params": ({"score": "additive", "is_causal": True},
                            {"score_params": additive}, kv),
        "callable_score": ({"score": lambda q, k, p: scores.dot(q, k) * p["s"]},
                           {"score_params": {"s": jnp.float32(0.3)}}, kv),
        "segment_ids": ({"q_segment_ids": segments, "kv_segment_ids": segments}, {}, kv),
        "sliding_window_mod": ({"mask_mod": mods.sliding_window(5, 2)}, {}, kv),
        "relative_bias": ({"score_mod": mods.relative_position_bias(8, 16), "is_causal": True},
                          {"mod_params": {"relative_bias": table}}, kv),
    }  # fmt: skip
    if extended:
        _, k_long, v_long = qkv(2, batch, 10 * devices, 10 * devices, heads, kv_heads, head_dim)
        lengths = {"query_seq_lengths": jnp.array([length, length - 7]),
                   "key_value_seq_lengths": jnp.array([length - 4, length - 11])}  # fmt: skip
        documents = {"document_ids": segments}
        cases |= {
            "lengths_temperature": ({"is_causal": True, **lengths},
                                    {"temperature": jnp.array([0.5, 1, 2, 3])[:, None, None]},
                                    kv),
            "document_mod_window": ({"mask_mod": mods.document(), "mod_params": documents,
                                     "local_window_size": (4, 1)}, {}, kv),
            "cross_contiguous_causal": ({"is_causal": True, "causal_offset": 4 * devices,
                                         "layout": "contiguous"}, {}, (k_long, v_long)),
            "pallas_blocks": ({"is_causal": True, "implementation": "pallas"}, {}, kv),
            "pallas_relative_bias": ({"score_mod": mods.relative_position_bias(8, 16),
                                      "is_causal": True, "implementation": "pallas"},
                                     {"mod_params": {"relative_bias": table}}, kv),
            "bias_rows_and_mask": ({"mask": _random_mask(length)},
                                   {"bias": jax.random.normal(ks[0], (heads, length, length))},
                                   kv),
            "bias_columns": ({"is_causal": True},
                             {"bias": jax.random.normal(ks[1], (batch, heads, 1, length))}, kv),
        }  # fmt: skip
    return q, cases


def _random_mask(length: int):
    """A random boolean ``[T, S]`` mask with a visible diagonal (no empty rows)."""
    import jax
    import jax.numpy as jnp

    return jax.random.bernoulli(jax.random.key(5), 0.6, (length, length)) | jnp.eye(
        length, dtype=bool
    )


def main(devices: int, extended: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import attnjax as aj
    from attnjax.sharded import ring_attention
    from tests.parity import max_rel_error

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seq",))
    q, cases = _cases(devices, extended)
    sharded_only = ("layout", "implementation")
    found = {}
    for strategy in ("ring", "all_gather"):
        for name, (fixed, diff, (k, v)) in cases.items():
            dense = {n: x for n, x in fixed.items() if n not in sharded_only}

            def sharded(q, k, v, diff, fixed=fixed, strategy=strategy):
                return ring_attention(q, k, v, mesh=mesh, axis="seq", strategy=strategy,
                                      **fixed, **diff)  # fmt: skip

            def reference(q, k, v, diff, dense=dense):
                return aj.attention(q, k, v, implementation="xla", **dense, **diff)

            def grad(fn):
                def loss(*args):
                    out = fn(*args)
                    return jnp.sum(out * jnp.cos(out)), out

                return jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)

            g_sharded, out_sharded = jax.jit(grad(sharded))(q, k, v, diff)
            g_ref, out_ref = grad(reference)(q, k, v, diff)
            found[f"{strategy}/{name}"] = [
                max_rel_error(out_sharded, out_ref),
                max_rel_error(g_sharded, g_ref),
            ]
    if extended:
        found |= _inside_shard_map(mesh, q, cases["scaled_dot_causal_offset"][2])
        found["errors/mesh_mismatch"] = _error(_mesh_mismatch, mesh, q)
        found["errors/length"] = _error(
            lambda: ring_attention(
                q[:, :20], q[:, :20], q[:, :20], mesh=mesh, axis="seq", is_causal=True
            )
        )
        found["layout/zigzag"] = _dealt(mesh)
        found["gpu_choice_with_bias"] = _gpu_choice_with_bias(mesh, q)
        found |= _nonfinite(mesh, q)
    print(json.dumps(found))


def _nonfinite(mesh, q):
    """A NaN in one query and an ``inf`` in one key (causal; finite values, as ``jax.nn``
    multiplies a NaN value by the zero weights of masked keys): per strategy, whether the
    sharded output's NaN entries are ``jax.nn``'s, the largest difference elsewhere, and
    whether every gradient holds NaN."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from attnjax.sharded import ring_attention

    found = {}
    cases = {
        "nan_query": (q.at[0, 3, 1, 2].set(jnp.nan), q),
        "inf_key": (q, q.at[1, 5, 0].set(jnp.inf)),
    }
    for strategy in ("ring", "all_gather"):
        for name, (query, key) in cases.items():

            def sharded(query, key, strategy=strategy):
                return ring_attention(query, key, q, mesh=mesh, axis="seq", strategy=strategy,
                                      is_causal=True)  # fmt: skip

            out = jax.jit(sharded)(query, key)
            ref = jax.nn.dot_product_attention(query, key, q, is_causal=True)
            loss = lambda *a, fn=sharded: jnp.sum(jnp.sin(fn(*a)))  # noqa: E731
            grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(query, key)
            same = bool(np.array_equal(np.isnan(out), np.isnan(ref)) and np.isnan(ref).any())
            finite = ~np.isnan(ref)
            error = float(np.max(np.abs(np.asarray(out)[finite] - np.asarray(ref)[finite])))
            found[f"nonfinite/{strategy}/{name}"] = [
                same,
                error,
                all(np.isnan(g).any() for g in grads),
            ]
    return found


def _inside_shard_map(mesh, q, kv):
    """``ring_attention_shard`` in a ``shard_map`` of one's own, with a cosine scale."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    import attnjax as aj
    from attnjax.sharded import ring_attention_shard
    from tests.parity import max_rel_error

    found = {}
    seq, kwargs = PartitionSpec(None, "seq"), {"is_causal": True, "score": "cosine"}
    for strategy in ("ring", "all_gather"):

        def local(q, k, v, scale, strategy=strategy):
            return ring_attention_shard(q, k, v, axis_name="seq", strategy=strategy,
                                        score_params={"scale": scale}, **kwargs)  # fmt: skip

        sharded = jax.shard_map(local, mesh=mesh, in_specs=(seq, seq, seq, PartitionSpec()),
                                out_specs=seq, check_vma=False)  # fmt: skip

        def reference(q, k, v, scale):
            return aj.attention(q, k, v, score_params={"scale": scale}, **kwargs)

        outs, grads = [], []
        for fn in (jax.jit(sharded), reference):
            outs.append(fn(q, *kv, jnp.float32(3.0)))
            loss = lambda *a, fn=fn: jnp.sum(jnp.sin(fn(*a)))  # noqa: E731
            grads.append(jax.grad(loss, argnums=(0, 1, 2, 3))(q, *kv, jnp.float32(3.0)))
        found[f"{strategy}/inside_shard_map"] = [max_rel_error(*outs), max_rel_error(*grads)]
    return found


def _mesh_mismatch(mesh, q):
    """Arrays spread over two devices, called with the mesh of all four."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from attnjax.sharded import ring_attention

    half = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("seq",))
    q = jax.device_put(q, NamedSharding(half, PartitionSpec(None, "seq")))
    ring_attention(q, q, q, mesh=mesh, axis="seq")


def _dealt(mesh):
    """Positions ``0..15`` dealt by the zigzag layout (as each device holds them), and
    dealt back."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from attnjax.sharded import Layout

    layout = Layout("zigzag", 4)

    def deal(x):
        dealt = layout.deal(x, "seq")
        return dealt, layout.undeal(dealt, "seq")

    seq = PartitionSpec(None, "seq")
    dealt, back = jax.shard_map(deal, mesh=mesh, in_specs=seq, out_specs=(seq, seq),
                                check_vma=False)(jnp.arange(16)[None])  # fmt: skip
    return [dealt[0].tolist(), back[0].tolist()]


def _gpu_choice_with_bias(mesh, q):
    """``implementation=None`` as on a GPU (the backend faked), with a bias over all keys:
    the blocks fall back to chunked (Pallas takes no bias); the forward error."""
    import jax

    import attnjax as aj
    from attnjax.sharded import ring_attention
    from tests.parity import max_rel_error

    bias = jax.random.normal(jax.random.key(9), (q.shape[2], q.shape[1], q.shape[1]))
    real = jax.default_backend
    jax.default_backend = lambda: "gpu"
    try:
        out = ring_attention(q, q, q, bias, mesh=mesh, axis="seq", is_causal=True)
    finally:
        jax.default_backend = real
    return max_rel_error(out, aj.attention(q, q, q, bias, is_causal=True, implementation="xla"))


def _error(fn, *args) -> str:
    try:
        fn(*args)
    except ValueError as error:
        return str(error)
    return "no error"


if __name__ == "__main__":
    main(int(sys.argv[1]), "extended" in sys.argv[2:])
