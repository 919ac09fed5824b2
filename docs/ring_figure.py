"""Draw docs/tiled.md's picture of ring attention: which blocks of a causal attention matrix
each of P = 4 devices computes at each ring step, for the contiguous and the zigzag layout.

    python docs/ring_figure.py      # writes docs/figures/ring_steps.png
"""

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from attnjax.sharded import Layout

SHARDS = 4
FIGURES = pathlib.Path(__file__).parent / "figures"


def step_blocks(layout: Layout, step: int) -> list[tuple[int, int, int, float]]:
    """``(device, query chunk, key chunk, work)`` of one ring step under a causal mask, in
    chunks of ``T / (P · chunks per device)``: work 1 below the diagonal, 1/2 on it, and 0
    above it (the block is skipped)."""
    n = layout.chunks_per_device
    blocks = []
    for device in range(layout.shards):
        source = (device - step) % layout.shards
        for i in range(n):
            for j in range(n):
                q, k = layout.chunk(device, i), layout.chunk(source, j)
                blocks.append((device, q, k, 1.0 if k < q else 0.5 if k == q else 0.0))
    return blocks


def main():
    layouts = [Layout("contiguous", SHARDS), Layout("zigzag", SHARDS)]
    colors = plt.get_cmap("tab10")(np.arange(SHARDS))
    fig, axes = plt.subplots(len(layouts), SHARDS, figsize=(3.0 * SHARDS, 4.1 * len(layouts)))
    for row, layout in zip(axes, layouts, strict=True):
        for step, ax in enumerate(row):
            image = np.ones((layout.num_chunks, layout.num_chunks, 4))
            work = np.zeros(SHARDS)
            for device, q, k, share in step_blocks(layout, step):
                work[device] += share / layout.chunks_per_device**2
                if share:
                    image[q, k] = colors[device] * [1, 1, 1, 1.0 if share == 1 else 0.45]
                else:
                    image[q, k] = [0.85, 0.85, 0.85, 1]
            ax.imshow(image)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{layout.name}, step {step}\nwork per device: "
                         + " ".join(f"{w:.2g}" for w in work), fontsize=9)  # fmt: skip
            if step == 0:
                ax.set_ylabel("query chunks (global order)")
            ax.set_xlabel("key chunks")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[d]) for d in range(SHARDS)]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=(0.85, 0.85, 0.85)))
    labels = [f"device {d}" for d in range(SHARDS)] + ["held, fully masked: skipped"]
    fig.legend(handles, labels, loc="lower center", ncol=SHARDS + 1, fontsize=9)
    fig.suptitle(
        "Ring attention, causal, P = 4: the blocks each device computes per step "
        "(pale: diagonal, half masked); work in units of one device's full block"
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(FIGURES / "ring_steps.png", dpi=110)


if __name__ == "__main__":
    main()
