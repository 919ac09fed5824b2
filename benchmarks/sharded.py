"""Per-device memory of sequence-parallel attention over P devices.

    python benchmarks/sharded.py                    # the figures of docs/performance.md
    python benchmarks/sharded.py --length 4096      # a quicker look

B=1, N=8, H=64, float32, causal (zigzag layout) unless ``--causal 0``. For each strategy and
P = 1, 2, 4, 8 the program is compiled, not run, on P devices of a mesh (on CPU they are
``--xla_force_host_platform_device_count`` devices, set here): the figure is the compiled
per-device program's temporary bytes, and ``P·temp(P) / temp(1)`` (1 when memory splits
perfectly over the devices); the last column compares with ``attnjax.attention`` (chunked) on
one device. Times are not measured: fake devices share one CPU.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from attention import compile_fn, with_grad

import attnjax as aj
from attnjax.sharded import ring_attention

B, N, H = 1, 8, 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--strategies", nargs="+", default=["ring", "all_gather"])
    parser.add_argument("--causal", type=int, default=1)
    args = parser.parse_args()
    x = jax.ShapeDtypeStruct((B, args.length, N, H), jnp.float32)
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].device_kind}; T={args.length}, "
          f"B={B}, N={N}, H={H}, float32, causal={bool(args.causal)}")  # fmt: skip
    print("\n| strategy | pass | P | temp MiB per device | P·temp(P) / temp(1) | "
          "P·temp(P) / chunked |\n|---|---|---|---|---|---|")  # fmt: skip
    chunked = {}
    for name in ("fwd", "fwd+bwd"):

        def one_device(q, k, v):
            return aj.attention(q, k, v, is_causal=bool(args.causal), implementation="chunked")

        chunked[name] = temp_bytes(one_device, name, x)
        print(f"| chunked, one device | {name} | 1 | {chunked[name] / 2**20:.1f} | | 1.00 |")
    for strategy in args.strategies:
        for name in ("fwd", "fwd+bwd"):
            single = None
            for shards in args.shards:
                mesh = jax.sharding.Mesh(np.array(jax.devices()[:shards]), ("seq",))

                def fn(q, k, v, mesh=mesh, strategy=strategy):
                    return ring_attention(q, k, v, mesh=mesh, axis="seq", strategy=strategy,
                                          is_causal=bool(args.causal))  # fmt: skip

                temp = temp_bytes(fn, name, x)
                single = single or temp
                print(f"| {strategy} | {name} | {shards} | {temp / 2**20:.1f} | "
                      f"{shards * temp / single:.2f} | {shards * temp / chunked[name]:.2f} |",
                      flush=True)  # fmt: skip


def temp_bytes(fn, name, x):
    """The compiled program's temporary bytes, forward or forward+backward."""
    return compile_fn(fn if name == "fwd" else with_grad(fn), (x, x, x))[2]


if __name__ == "__main__":
    main()
