"""Draw the gallery of docs/mods.md: each mask mod's elements and block mask, and the biases
of the score mods.

    python docs/mods_gallery.py     # writes docs/figures/mods_masks.png and mods_scores.png
"""

import pathlib

import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import attnjax as aj
from attnjax import masks, mods

T = 64
TILES = aj.BlockSizes(8, 8)
FIGURES = pathlib.Path(__file__).parent / "figures"
DATA = {
    "prefix_lengths": jnp.array([20]),
    "document_ids": jnp.repeat(jnp.arange(4), jnp.array([10, 22, 12, 20]))[None],
}
MASKS = {
    "causal()": mods.causal(),
    "sliding_window(12, 0)": mods.sliding_window(12, 0),
    "dilated(4)": mods.dilated(4),
    "prefix_lm()\nprefix 20": mods.prefix_lm(),
    "document()\n4 documents": mods.document(),
    "and_masks(causal(),\ndocument())": mods.and_masks(mods.causal(), mods.document()),
}


def draw_masks():
    fig, axes = plt.subplots(2, len(MASKS), figsize=(2.6 * len(MASKS), 5.4))
    for (name, mask_mod), top, bottom in zip(MASKS.items(), *axes, strict=True):
        idx = masks.mod_indices(1, 1, jnp.arange(T), jnp.arange(T), 0)
        top.imshow(np.asarray(jnp.broadcast_to(mask_mod(*idx, DATA), (1, 1, T, T)))[0, 0],
                   cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest")  # fmt: skip
        top.set_title(name, fontsize=9)
        block = masks.block_mask(mask_mod, DATA, 1, None, T, T, TILES)
        block.plot(ax=bottom)
        bottom.set_title(f"density {block.density():.0%}", fontsize=9)
        bottom.set_xlabel("key tile")
        bottom.set_ylabel("query tile")
    axes[0, 0].set_ylabel("query t")
    tiles = f"{TILES.block_q}x{TILES.block_k} tiles"
    fig.suptitle(f"mask mods, T = S = {T}: elements (top), {tiles} (bottom; dark full, "
                 "light partial, white skipped)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(FIGURES / "mods_masks.png", dpi=110)


def draw_scores():
    scores = {
        "alibi(8), head 0": mods.alibi(8),
        "relative_position_bias\n(32 buckets), head 0": mods.relative_position_bias(),
        "softcap(2) of a ramp": mods.softcap(2.0),
    }
    table = jnp.sin(jnp.arange(8 * 32, dtype=jnp.float32).reshape(8, 32) / 3)
    ramp = jnp.linspace(-6, 6, T)[None, None, :, None] * jnp.ones((1, 1, 1, T))
    fig, axes = plt.subplots(1, len(scores), figsize=(3.2 * len(scores), 3.2))
    for (name, score_mod), ax in zip(scores.items(), axes, strict=True):
        idx = masks.mod_indices(1, 1, jnp.arange(T), jnp.arange(T), 0)
        zero = ramp if "softcap" in name else jnp.zeros((1, 1, T, T))
        bias = score_mod(zero, *idx, {"relative_bias": table})
        image = ax.imshow(np.asarray(bias)[0, 0], cmap="RdBu_r", interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("key s")
    axes[0].set_ylabel("query t")
    fig.tight_layout()
    fig.savefig(FIGURES / "mods_scores.png", dpi=110)


if __name__ == "__main__":
    draw_masks()
    draw_scores()
