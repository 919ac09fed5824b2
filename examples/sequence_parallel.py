"""Train a causal transformer on MQAR with its sequence sharded over 4 devices, and the same
model on one device: the loss curves agree to float rounding.

    python examples/sequence_parallel.py                 # 4 CPU devices, 300 steps
    python examples/sequence_parallel.py --steps 5 --out /tmp/sp   # a quick check

On CPU the 4 devices are ``--xla_force_host_platform_device_count`` devices (set here): one
host's cores, so the run shows correctness, not speed. Both models start from the same
parameters (``ModelConfig(sequence_shards=4)`` adds no parameter) and see the same batches;
every attention layer of the sharded one runs :func:`attnjax.sharded.ring_attention` (ring
strategy, zigzag layout: the model is causal). Writes ``losses.csv`` and ``loss.png`` (both
curves and their difference) to ``--out`` and prints the largest difference.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import argparse
import csv
import dataclasses
import pathlib

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import optax
from flax import nnx

from attnjax import tasks
from attnjax.nn import ModelConfig, build

SHARDS = 4
TASK = tasks.get("mqar")
TASK_CONFIG = TASK.config(vocab_size=64, seq_len=64, num_pairs=8)
MODEL = ModelConfig(width=64, layers=2, heads=4, vocab_size=64, num_classes=64, causal=True,
                    positional="rope", score="scaled_dot")  # fmt: skip


def train(config: ModelConfig, steps: int, batch_size: int) -> list[float]:
    """The training loss at every step (Adam, learning rate 3e-3)."""
    model = build(config, nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, key):
        batch = TASK.generate(key, batch_size, TASK_CONFIG)
        loss, grads = nnx.value_and_grad(lambda m: TASK.loss(m(batch), batch))(model)
        optimizer.update(model, grads)
        return loss

    keys = jax.random.split(jax.random.key(1), steps)
    return [float(step(model, optimizer, key)) for key in keys]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("results/sequence_parallel")
    )
    args = parser.parse_args()
    curves = {
        "one device": train(MODEL, args.steps, args.batch_size),
        f"{SHARDS} devices": train(
            dataclasses.replace(MODEL, sequence_shards=SHARDS), args.steps, args.batch_size
        ),
    }
    one, sharded = curves.values()
    difference = [abs(a - b) for a, b in zip(one, sharded, strict=True)]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "losses.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *curves, "abs_difference"])
        writer.writerows(zip(range(args.steps), one, sharded, difference, strict=True))
    _plot(curves, difference, args.out / "loss.png")
    print(f"final loss: one device {one[-1]:.6f}, {SHARDS} devices {sharded[-1]:.6f}; "
          f"largest |difference| over {args.steps} steps: {max(difference):.2e}")  # fmt: skip


def _plot(curves: dict[str, list[float]], difference: list[float], path: pathlib.Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    for (name, losses), style in zip(curves.items(), ("-", "--"), strict=True):
        top.plot(losses, style, label=name)
    top.set_ylabel("training loss (nats)")
    top.legend()
    bottom.semilogy([max(d, 1e-9) for d in difference])
    bottom.set_xlabel("step")
    bottom.set_ylabel("|difference|")
    fig.suptitle(f"MQAR, causal transformer: sequence on one device vs sharded over {SHARDS}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
