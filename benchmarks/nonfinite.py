"""The cost of propagating non-finite values, same process.

    python benchmarks/nonfinite.py                # the figures of docs/performance.md
    python benchmarks/nonfinite.py --length 256   # a quicker look

attnjax's softmax keeps a NaN row NaN and counts ``-inf`` logits as masked keys (dense: one
compare joins the mask; tiled: a row is empty when its sum is exactly 0). The baseline is the
formulation before it, which turned NaN rows into zeros (``sum > 0`` tested for a non-empty
row; dense ``exp(x - max)`` unmasked without a mask). B=1, N=8, H=64, float32, causal, forward
and backward (the gradient of ``sum(out)`` with respect to q, k, v), on ``xla`` (dense) and
``chunked`` at 4x the length; median of ``--repeats`` runs, the two alternated.
"""

import argparse
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from attention import compile_fn, median_time

import attnjax as aj
from attnjax import chunked, dense
from attnjax.softmax import MASK_VALUE

B, N, H = 1, 8, 64


def zeroing_softmax_with_lse(logits, mask=None):
    """The baseline dense softmax: a NaN row's ``sum > 0`` is false, so it became 0."""
    x = jnp.asarray(logits, jnp.float32)
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask, bool), x.shape)
        x = jnp.where(mask, x, MASK_VALUE)
    row_max = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    e = jnp.exp(x - row_max)
    if mask is not None:
        e = jnp.where(mask, e, 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    nonempty = total > 0
    safe_total = jnp.where(nonempty, total, 1.0)
    lse = jnp.where(nonempty, row_max + jnp.log(safe_total), -jnp.inf)[..., 0]
    return e / safe_total, lse


def zeroing_online_finish(carry):
    """The baseline end of the online softmax (the same test as above)."""
    m, total, acc = carry
    nonempty = total > 0
    safe_total = jnp.where(nonempty, total, 1.0)
    out = jnp.where(nonempty[..., None], acc / safe_total[..., None], 0.0)
    return out, jnp.where(nonempty, m + jnp.log(safe_total), -jnp.inf)


@contextlib.contextmanager
def baseline():
    """The implementations with the baseline softmax, while the block runs."""
    saved = dense.masked_softmax_with_lse, chunked.online_finish
    dense.masked_softmax_with_lse = zeroing_softmax_with_lse
    chunked.online_finish = zeroing_online_finish
    try:
        yield
    finally:
        dense.masked_softmax_with_lse, chunked.online_finish = saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="dense length; chunked 4x")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| implementation | T | baseline ms | attnjax ms | attnjax / baseline |")
    print("|---|---|---|---|---|")
    for implementation, length in (("xla", args.length), ("chunked", 4 * args.length)):
        ks = jax.random.split(jax.random.key(0), 3)
        qkv = tuple(jax.random.normal(k, (B, length, N, H), jnp.float32) for k in ks)

        def loss(q, k, v, implementation=implementation):
            out = aj.attention(q, k, v, is_causal=True, implementation=implementation)
            return jnp.sum(out)

        grad = jax.grad(loss, argnums=(0, 1, 2))
        with baseline():
            old = compile_fn(grad, qkv)[0]
        new = compile_fn(grad, qkv)[0]
        times = {old: [], new: []}
        for _ in range(args.repeats):  # alternated, so drift on a busy machine hits both
            for compiled in times:
                times[compiled].append(median_time(compiled, qkv, 1)[0])
        before, after = (float(np.median(times[c])) for c in (old, new))
        grads_before, grads_after = old(*qkv), new(*qkv)
        pairs = zip(grads_after, grads_before, strict=True)
        error = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
        assert error < 1e-5, f"{implementation}: gradients differ from the baseline by {error}"
        print(
            f"| {implementation} | {length} | {before * 1e3:.1f} | {after * 1e3:.1f} "
            f"| {after / before:.3f} |"
        )


if __name__ == "__main__":
    main()
