"""The cost of hook points, same process.

    python benchmarks/hooks.py                 # the figures of docs/inspect.md
    python benchmarks/hooks.py --length 64     # a quicker look

A causal transformer (``--layers`` layers, width 256, 8 heads, vocabulary 256, batch 1) at
``--length`` tokens on ``xla`` (dense) and ``chunked``. The baseline is the model's plain
forward. Each row is one jit-compiled forward: ``run_with_hooks`` with no hooks (a session
that selects nothing), ``run_with_cache`` of one point per layer (``*.attention.z``), of every
point (on ``chunked`` the patterns recomputed for 8 query rows), and a zero-ablation of one
head. Columns: median time over ``--repeats`` runs, its ratio to the baseline, and the
compiled program's output and temporary memory (what the cache keeps). The calls alternate
within each repeat, so a change of load hits them alike.
"""

import argparse

import jax
import numpy as np
from attention import compile_fn, median_time
from flax import nnx

import attnjax.nn as ann

WIDTH, HEADS, VOCAB = 256, 8, 256


def variants(model, length):
    """name -> (batch -> output): the baseline first."""
    rows = [0, length // 2, length - 1]

    def ablate(z, context):
        return z.at[..., 0, :].set(0.0)

    return {
        "plain forward": lambda b: model(b),
        "run_with_hooks, no hooks": lambda b: ann.run_with_hooks(model, b, {}),
        "cache *.attention.z": lambda b: ann.run_with_cache(model, b, "*.attention.z"),
        "cache every point": lambda b: ann.run_with_cache(model, b, rows=rows),
        "zero-ablate one head": lambda b: ann.run_with_hooks(
            model, b, {"encoder.blocks.0.attention.z": ablate}
        ),
    }


def run(args):
    print(f"B=1, D={WIDTH}, N={HEADS}, L={args.layers}, T={args.length}, float32, causal, CPU")
    print("| implementation | call | ms | ratio | output MB | temporary MB |")
    print("|---|---|---|---|---|---|")
    for implementation in ("xla", "chunked"):
        config = ann.ModelConfig(
            width=WIDTH, layers=args.layers, heads=HEADS, vocab_size=VOCAB, num_classes=VOCAB,
            causal=True, max_len=args.length, implementation=implementation,
        )  # fmt: skip
        model = ann.build(config, nnx.Rngs(0))
        batch = {"inputs": jax.random.randint(jax.random.key(1), (1, args.length), 0, VOCAB)}
        calls = variants(model, args.length)
        compiled = {name: compile_fn(fn, (batch,)) for name, fn in calls.items()}
        times = {name: [] for name in compiled}
        for _ in range(args.repeats):  # the calls alternate, so load changes hit them alike
            for name, (fn, _, _) in compiled.items():
                times[name].append(median_time(fn, (batch,), 1)[0])
        base = np.median(times["plain forward"])
        for name, (fn, _, temporary) in compiled.items():
            seconds = np.median(times[name])
            output = fn.memory_analysis().output_size_in_bytes
            print(
                f"| {implementation} | {name} | {seconds * 1e3:.2f} | {seconds / base:.2f} | "
                f"{output / 2**20:.2f} | {temporary / 2**20:.2f} |"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
