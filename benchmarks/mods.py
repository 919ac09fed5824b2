"""Score and mask mods on the chunked path against their baselines, same process.

    python benchmarks/mods.py                   # the figures of docs/performance.md
    python benchmarks/mods.py --length 1024     # a quicker look

B=1, N=8, H=64, float32 (CPU). Per group, the first row is the baseline; speed-up = baseline
time / time (median of ``--repeats`` after a warm-up, compile timed separately); memory = the
compiled program's temporary bytes. Block masks are built once and passed with
``block_mask=``; building one is its own row.

- document: a ``document`` mask_mod (16 equal documents) with its block mask, against
  ``jax.nn.dot_product_attention`` and chunked given the same mask as a dense boolean array.
- window: ``sliding_window(256, 0)`` as a mask_mod with its block mask, against chunked's
  built-in ``local_window_size=(256, 0)``.
- softcap: chunked with ``softcap(30)`` against chunked without a mod, at half the length.
- relative bias: forward+backward with a learnable ``relative_position_bias``: temporary
  memory at length/4, length/2 and length, and the table's gradient against the dense
  reference (a ``bias`` array gathered from the table) at length/8.
- On a GPU, instead of the groups above: the Pallas kernel in bfloat16, B=2, N=16, H=128,
  causal with ``softcap`` and ``alibi`` against the same kernel without mods, and a
  ``document`` mask_mod with its block mask against the kernel without a mask and
  ``jax.nn`` with the dense mask.
"""

import argparse
import time

import jax
import jax.numpy as jnp
from attention import compile_fn, median_time

import attnjax as aj
from attnjax import masks, mods

B, N, H = 1, 8, 64
TABLE_BUCKETS = dict(num_buckets=32, max_distance=128)


KEY = jax.random.key(0)


def qkv(length):
    ks = jax.random.split(KEY, 3)
    return tuple(jax.random.normal(k, (B, length, N, H), jnp.float32) for k in ks)


def table_row(name, seconds, compile_s, temp, baseline):
    ratio = baseline / seconds if baseline else 1.0
    print(f"| {name} | {compile_s:.1f} | {seconds * 1e3:.1f} | {ratio:.2f} | {temp / 2**20:.1f} |")


def group(title, rows, args, repeats, same_output=True):
    """Time each ``name -> fn(*args)``; the first is the baseline (``same_output``: every row
    must agree with it)."""
    print(f"\n{title}\n\n| run | compile s | ms | speed-up | temp MiB |\n|---|---|---|---|---|")
    baseline, outputs = None, []
    for name, fn in rows.items():
        compiled, compile_s, temp = compile_fn(fn, args)
        seconds, out = median_time(compiled, args, repeats)
        baseline = baseline or seconds
        table_row(name, seconds, compile_s, temp, baseline)
        outputs.append(out)
    for out in outputs[1:] if same_output else ():
        err = float(jnp.max(jnp.abs(out - outputs[0])))
        assert err < 1e-4, f"{title}: a row differs from its baseline by {err:.1e}"


def timed_block_mask(mask_mod, params, length, blocks):
    """``(block mask, build seconds after compile)``."""

    def build(p):
        return masks.block_mask(mask_mod, p, B, None, length, length, blocks)

    compiled = jax.jit(build).lower(params).compile()
    seconds, block = median_time(compiled, (params,), 3)
    return block, seconds


def documents(batch, length):
    """``(mod_params, dense mask [batch, 1, length, length])`` of 16 equal documents."""
    ids = (jnp.arange(length) // (length // 16))[None].repeat(batch, 0)
    return {"document_ids": ids}, (ids[:, :, None] == ids[:, None, :])[:, None]


def document_group(length, blocks, repeats):
    params, dense = documents(B, length)
    block, build_s = timed_block_mask(mods.document(), params, length, blocks)
    print(f"\nblock mask for 16 documents: {block}, built in {build_s * 1e3:.1f} ms")
    q, k, v = qkv(length)
    group(
        f"document mask, T={length}",
        {
            "jax.nn, dense mask": lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m),
            "chunked, dense mask": lambda q, k, v, m: aj.attention(
                q, k, v, mask=m, implementation="chunked"
            ),
            f"chunked, document mask_mod, block mask {blocks.block_q}x{blocks.block_k}": (
                lambda q, k, v, m: aj.attention(
                    q, k, v, block_mask=block, mod_params=params, implementation="chunked"
                )
            ),
        },
        (q, k, v, dense),
        repeats,
    )


def window_group(length, blocks, repeats):
    window = mods.sliding_window(256, 0)
    block, build_s = timed_block_mask(window, None, length, blocks)
    print(f"\nblock mask for sliding_window(256, 0): {block}, built in {build_s * 1e3:.1f} ms")
    q, k, v = qkv(length)
    group(
        f"sliding window, T={length}",
        {
            "chunked, local_window_size=(256, 0)": lambda q, k, v: aj.attention(
                q, k, v, local_window_size=(256, 0), implementation="chunked"
            ),
            f"chunked, local_window_size=(256, 0), {blocks.block_q}x{blocks.block_k}": (
                lambda q, k, v: aj.attention(
                    q,
                    k,
                    v,
                    local_window_size=(256, 0),
                    implementation="chunked",
                    block_sizes=blocks,
                )
            ),
            f"chunked, sliding_window mask_mod, block mask {blocks.block_q}x{blocks.block_k}": (
                lambda q, k, v: aj.attention(q, k, v, block_mask=block, implementation="chunked")
            ),
        },
        (q, k, v),
        repeats,
    )


def softcap_group(length, repeats):
    q, k, v = qkv(length)
    group(
        f"softcap, T={length}",
        {
            "chunked": lambda q, k, v: aj.attention(q, k, v, implementation="chunked"),
            "chunked, softcap(30)": lambda q, k, v: aj.attention(
                q, k, v, score_mod=mods.softcap(30.0), implementation="chunked"
            ),
        },
        (q, k, v),
        repeats,
        same_output=False,
    )


def relative_bias_loss(implementation):
    def loss(q, k, v, table):
        kwargs = {"score_mod": mods.relative_position_bias(**TABLE_BUCKETS)}
        params = {"relative_bias": table}
        if implementation == "dense reference":
            t = jnp.arange(q.shape[1])
            bucket = mods.relative_position_bucket(
                t[None, :] - t[:, None], bidirectional=True, **TABLE_BUCKETS
            )
            out = aj.attention(q, k, v, bias=table[:, bucket], implementation="xla")
        else:
            out = aj.attention(q, k, v, mod_params=params, implementation="chunked", **kwargs)
        return jnp.sum(out * jnp.cos(out))

    return jax.grad(loss, argnums=(0, 1, 2, 3))


def relative_bias_group(length, repeats):
    print("\nrelative_position_bias, forward+backward\n\n| T | temp MiB | ms |\n|---|---|---|")
    table = 0.1 * jax.random.normal(jax.random.key(1), (N, TABLE_BUCKETS["num_buckets"]))
    for t in (length // 4, length // 2, length):
        args = (*qkv(t), table)
        compiled, _, temp = compile_fn(relative_bias_loss("chunked"), args)
        seconds, _ = median_time(compiled, args, max(1, repeats // 2))
        print(f"| {t} | {temp / 2**20:.1f} | {seconds * 1e3:.0f} |")
    args = (*qkv(length // 8), table)
    grads = [jax.jit(relative_bias_loss(name))(*args)[3] for name in ("chunked", "dense reference")]
    scale = max(1.0, float(jnp.max(jnp.abs(grads[1]))))
    print(
        f"\ntable gradient at T={length // 8}: max |chunked - dense| / max(1, max |dense|) = "
        f"{float(jnp.max(jnp.abs(grads[0] - grads[1]))) / scale:.1e}"
    )


def gpu_groups(length, repeats):
    """The Pallas kernel in bfloat16, B=2, N=16, H=128: causal with softcap + ALiBi against
    without mods, and a document mask_mod (16 documents) with its block mask against the
    kernel without a mask and ``jax.nn`` with the dense mask."""
    shape = (2, length, 16, 128)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in jax.random.split(KEY, 3))
    score_mod = mods.compose(mods.softcap(30.0), mods.alibi(16))
    group(
        f"Pallas, causal, bfloat16, B=2 N=16 H=128, T={length}",
        {
            "pallas": lambda q, k, v: aj.attention(
                q, k, v, is_causal=True, implementation="pallas"
            ),
            "pallas, softcap(30) + alibi": lambda q, k, v: aj.attention(
                q, k, v, is_causal=True, score_mod=score_mod, implementation="pallas"
            ),
        },
        (q, k, v),
        repeats,
        same_output=False,
    )
    params, dense = documents(2, length)
    tiles = aj.BlockSizes(128, 64)  # the kernel's bfloat16 tiles
    block = masks.block_mask(mods.document(), params, 2, None, length, length, tiles)
    print(f"\nblock mask for 16 documents: {block}")
    group(
        f"Pallas, document mask, bfloat16, B=2 N=16 H=128, T={length}",
        {
            "pallas, no mask": lambda q, k, v: aj.attention(q, k, v, implementation="pallas"),
            "jax.nn, dense mask": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=dense),
            "pallas, document mask_mod, block mask 128x64": lambda q, k, v: aj.attention(
                q, k, v, block_mask=block, mod_params=params, implementation="pallas"
            ),
        },
        (q, k, v),
        repeats,
        same_output=False,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-q", type=int, default=128)
    parser.add_argument("--block-k", type=int, default=128)
    args = parser.parse_args()
    blocks = aj.BlockSizes(args.block_q, args.block_k)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, B={B} N={N} H={H} float32")
    start = time.perf_counter()
    if jax.default_backend() == "gpu":
        gpu_groups(args.length, args.repeats)
    else:
        document_group(args.length, blocks, args.repeats)
        window_group(args.length, blocks, args.repeats)
        softcap_group(args.length // 2, args.repeats)
        relative_bias_group(args.length, args.repeats)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
