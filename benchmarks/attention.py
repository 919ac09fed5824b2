"""Speed and memory of attnjax's attention implementations against ``jax.nn``, same process.

    python benchmarks/attention.py                 # the table of docs/performance.md
    python benchmarks/attention.py --lengths 1024  # a quicker look

Per row: compile time, median of ``--repeats`` runs after one warm-up, GFLOP/s by
FlashAttention's convention (forward ``4·B·N·T·S·H``, halved for causal; backward 2.5× the
forward), that as a fraction of a large matmul measured in the same run, and the compiled
program's temporary memory (``memory_analysis().temp_size_in_bytes``). Ratios compare with
the baseline of the same length and pass: ``jax.nn.dot_product_attention`` (or its
``jax.grad``), and for additive scoring (unmasked rows only) the dense materializing path.
On a GPU the table adds attnjax's Pallas kernel, JAX's own Pallas ``mha`` and cuDNN; on a TPU
attnjax's Mosaic kernel (``pallas_tpu``) and JAX's TPU flash and splash kernels.
Speed-up = baseline time / time; memory ratio = baseline temporaries / temporaries.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import attnjax as aj


def compile_fn(fn, args):
    """``(compiled, compile seconds, temporary bytes)``."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start, compiled.memory_analysis().temp_size_in_bytes


def median_time(compiled, args, repeats):
    """``(median seconds of repeats runs after one warm-up, the warm-up's result)``."""
    result = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def matmul_gflops(repeats, dtype, size):
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    seconds, _ = median_time(compile_fn(lambda x, y: x @ y, (a, a))[0], (a, a), repeats)
    return 2 * size**3 / seconds / 1e9


def with_grad(fn):
    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def implementations(causal, additive_params, pallas_blocks=()):
    """name -> (q, k, v) -> output; the first of each group is the baseline."""
    impls = {
        "jax.nn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal),
        "chunked": lambda q, k, v: aj.attention(
            q, k, v, is_causal=causal, implementation="chunked"
        ),
    }
    if jax.default_backend() == "gpu":
        from jax.experimental.pallas.ops.gpu.attention import mha

        from attnjax.pallas.mosaic_gpu import flash

        for blocks in (None, *pallas_blocks):
            name = "pallas" if blocks is None else f"pallas {blocks.block_q}x{blocks.block_k}"
            impls[name] = lambda q, k, v, blocks=blocks: aj.attention(
                q, k, v, is_causal=causal, implementation="pallas", block_sizes=blocks
            )
        impls["jax pallas mha"] = lambda q, k, v: mha(
            q, k, v, None, sm_scale=q.shape[-1] ** -0.5, causal=causal
        )
        impls["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="cudnn"
        )
        impls["mosaic_gpu"] = lambda q, k, v: flash(
            (q * q.shape[-1] ** -0.5).astype(q.dtype), k, v, causal
        )[0]  # attnjax.pallas.mosaic_gpu: not yet validated on a GPU
    if jax.default_backend() == "tpu":
        impls.update(tpu_implementations(causal))
    if additive_params is not None:
        additive_impls = [("additive dense", "xla"), ("additive chunked", "chunked")]
        if jax.default_backend() == "gpu":
            additive_impls.append(("additive pallas", "pallas"))
        for name, impl in additive_impls:
            impls[name] = lambda q, k, v, impl=impl: aj.attention(
                q, k, v, score="additive", score_params=additive_params,
                is_causal=causal, implementation=impl,
            )  # fmt: skip
    return impls


def tpu_implementations(causal):
    """attnjax's Mosaic kernel and JAX's TPU flash and splash kernels (heads first; splash
    takes one example and no scale, so it is vmapped over the batch with ``q`` pre-scaled)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as splash_mask,
    )

    def heads_first(fn):
        def apply(q, k, v):
            out = fn(*(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), q.shape[-1] ** -0.5)
            return jnp.swapaxes(out, 1, 2)

        return apply

    def splash_attention(q, k, v, scale):
        one = splash_mask.CausalMask if causal else splash_mask.FullMask
        heads = splash_mask.MultiHeadMask([one((q.shape[2], k.shape[2]))] * q.shape[1])
        kernel = splash.make_splash_mha(heads, head_shards=1, q_seq_shards=1)
        return jax.vmap(kernel)(q * scale, k, v)

    return {
        "pallas_tpu": lambda q, k, v: aj.attention(
            q, k, v, is_causal=causal, implementation="pallas_tpu"
        ),
        "jax tpu flash": heads_first(
            lambda q, k, v, scale: tpu_flash.flash_attention(q, k, v, causal=causal, sm_scale=scale)
        ),
        "jax splash": heads_first(splash_attention),
    }


def run(args):
    batch, heads, head_dim = args.batch, args.heads, args.head_dim
    dtype = jnp.dtype(args.dtype)
    size = 8192 if jax.default_backend() == "gpu" else 4096
    matmul = matmul_gflops(args.repeats, dtype, size)
    print(f"# {jax.devices()[0].device_kind} ({jax.default_backend()}), {dtype.name}, "
          f"B={batch} N={heads} H={head_dim}; matmul {size}^3: {matmul:.0f} GFLOP/s\n")  # fmt: skip
    header = (
        "| impl | T | causal | pass | compile s | time ms | GFLOP/s | % matmul | temp MiB "
        "| speed-up | mem ratio | max error |"
    )
    print(header)
    print("|---" * 12 + "|")
    ks = jax.random.split(jax.random.key(0), 6)
    for length in args.lengths:
        shape = (batch, length, heads, head_dim)
        q, k, v = (jax.random.normal(key, shape, dtype) for key in ks[:3])
        additive = None
        if length <= args.additive_max_length:
            a_dim = args.additive_dim
            additive = {
                "w_q": jax.random.normal(ks[3], (head_dim, a_dim)) / head_dim**0.5,
                "w_k": jax.random.normal(ks[4], (head_dim, a_dim)) / head_dim**0.5,
                "v": jax.random.normal(ks[5], (a_dim,)),
            }
        for causal in args.causal:
            flops = 4 * batch * heads * length * length * head_dim / (2 if causal else 1)
            for pass_name in args.passes:
                timed = pass_name == "fwd" or length <= args.max_grad_length
                factor = 1.0 if pass_name == "fwd" else 3.5
                baseline = {}
                impls = implementations(causal, None if causal else additive, args.pallas_blocks)
                for name, fn in impls.items():
                    if args.impls and name not in args.impls:
                        continue
                    fn = fn if pass_name == "fwd" else with_grad(fn)
                    group = "additive" if name.startswith("additive") else "dot"
                    try:
                        compiled, compile_s, temp = compile_fn(fn, (q, k, v))
                    except Exception as error:  # e.g. cuDNN refusing float32
                        print(f"| {name} | {length} | {causal} | {pass_name} | failed: "
                              f"{str(error).splitlines()[0][:120]} |", flush=True)  # fmt: skip
                        continue
                    fits = temp <= args.max_temp_gib * 2**30
                    seconds = result = None
                    if timed and fits:
                        seconds, result = median_time(compiled, (q, k, v), args.repeats)
                    baseline.setdefault(group, (seconds, temp, result))
                    base_s, base_temp, base_result = baseline[group]
                    gflops = flops * factor / seconds / 1e9 if seconds else None
                    error = (
                        max_rel_error(result, base_result)
                        if result is not None and base_result is not None
                        else None
                    )
                    cells = [
                        name, length, causal, pass_name, f"{compile_s:.1f}",
                        _fmt(seconds, 1e3, ".2f"), _fmt(gflops, 1, ".0f"),
                        _fmt(gflops and gflops / matmul, 100, ".0f"),
                        f"{temp / 2**20:.0f}",
                        _fmt(base_s and seconds and base_s / seconds, 1, ".2f", "×"),
                        _fmt(base_temp / temp if min(temp, base_temp) >= 2**20 else None,
                             1, ".1f", "×"),  # below 1 MiB: not meaningful
                        _fmt(error, 1, ".1e"),
                    ]  # fmt: skip
                    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def max_rel_error(actual, expected):
    """Largest absolute difference over the largest magnitude of the baseline's result."""
    errors = [
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - e.astype(jnp.float32))))
        / max(1.0, float(jnp.max(jnp.abs(e.astype(jnp.float32)))))
        for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True)
    ]
    return max(errors)


def _fmt(x, scale, spec, suffix=""):
    return "—" if x is None else f"{x * scale:{spec}}{suffix}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1], help="0/1 values")
    parser.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--max-grad-length", type=int, default=2048, help="longer fwd+bwd: memory only"
    )
    parser.add_argument("--additive-dim", type=int, default=64)
    parser.add_argument(
        "--additive-max-length", type=int, default=2048, help="longer: no additive rows"
    )
    parser.add_argument(
        "--max-temp-gib", type=float, default=12.0, help="larger temporaries: memory only"
    )
    parser.add_argument("--impls", nargs="+", help="only these rows (names as in the table)")
    parser.add_argument(
        "--pallas-blocks", nargs="+", default=[], help="GPU: extra pallas rows, e.g. 128x64"
    )
    args = parser.parse_args()
    args.pallas_blocks = [aj.BlockSizes(*map(int, b.split("x"))) for b in args.pallas_blocks]
    args.causal = [bool(c) for c in args.causal]
    run(args)


if __name__ == "__main__":
    main()
