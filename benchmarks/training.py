"""Training throughput of the XOR-relation model: S seeds vectorized with ``vmap`` in one
program against the same S seeds trained one after another, same process.

    python benchmarks/training.py             # S = 8, 200 steps per measurement
    python benchmarks/training.py --sweep     # also the wall time of the full XOR sweep

Throughput counts seed-steps per second (S runs × steps / seconds), median of ``--repeats``
chunks after a warm-up chunk; compile time is reported separately.
"""

import argparse
import pathlib
import statistics
import tempfile
import time

import jax

from attnjax.experiment import Runs, load_file, sweep, with_overrides
from attnjax.experiment.trainer import Trainer

ROOT = pathlib.Path(__file__).parents[1]


def seed_steps_per_second(trainer: Trainer, runs: Runs, repeats: int) -> tuple[float, float]:
    """``(compile seconds, median seed-steps per second)`` of ``trainer``'s training chunk."""
    state, lrs = trainer.init(runs)
    steps = trainer.config.train.eval_every
    start = time.perf_counter()
    state, loss = trainer.train_chunk(state, runs, lrs, 0)
    jax.block_until_ready(loss)
    compile_s = time.perf_counter() - start
    rates = []
    for i in range(repeats):
        start = time.perf_counter()
        state, loss = trainer.train_chunk(state, runs, lrs, (i + 1) * steps)
        jax.block_until_ready(loss)
        rates.append(len(runs) * steps / (time.perf_counter() - start))
    return compile_s, statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="also time the full XOR sweep")
    parser.add_argument(
        "--optimized",
        action="store_true",
        help="XLA backend optimization level 1 (fast_compile off)",
    )
    args = parser.parse_args()

    base = load_file(ROOT / "configs" / "xor_relation.py").get_config()
    config = with_overrides(
        base,
        {"train.eval_every": args.steps, "train.steps": args.steps,
         "train.fast_compile": not args.optimized},
    )  # fmt: skip
    trainer = Trainer(config)
    compile_v, vectorized = seed_steps_per_second(
        trainer, Runs.grid(range(args.seeds), [3e-3]), args.repeats
    )
    sequential_compile, sequential = [], []
    for seed in range(args.seeds):  # one program, compiled once, reused for every seed
        c, rate = seed_steps_per_second(trainer, Runs.grid([seed], [3e-3]), args.repeats)
        sequential_compile.append(c)
        sequential.append(rate)
    # S runs one after another: total time is the sum of each run's time.
    sequential_rate = args.seeds / sum(1 / r for r in sequential)
    print(f"# {jax.devices()[0].device_kind}, XOR-relation model, batch "
          f"{config.train.batch_size}, {args.seeds} seeds\n")  # fmt: skip
    print("| mode | compile s | seed-steps/s | ratio |")
    print("|---|---|---|---|")
    print(f"| {args.seeds} seeds sequential | {sequential_compile[0]:.1f} | "
          f"{sequential_rate:.0f} | 1.00× |")  # fmt: skip
    print(f"| {args.seeds} seeds vmapped | {compile_v:.1f} | {vectorized:.0f} | "
          f"{vectorized / sequential_rate:.2f}× |")  # fmt: skip
    if args.sweep:
        experiment = load_file(ROOT / "experiments" / "xor_relation.py").get_experiment()
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            sweep(experiment, out, num_seeds=3)
            print(f"\nfull XOR sweep, 3 seeds: {time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
