"""The ``attnjax`` command line."""

import argparse
import math

import jax
import jax.numpy as jnp

from attnjax.attention import attention
from attnjax.scores import dot, scaled_dot


def demo(num_samples: int = 4096, num_keys: int = 16) -> None:
    """Why scores are scaled (Vaswani et al., 2017), measured with the functional core.

    For unit-variance q, k the unscaled logit variance grows as H and softmax saturates;
    ``scaled_dot`` keeps both flat. Then ``attention`` is checked against ``jax.nn``.
    """
    print(f"softmax over {num_keys} keys, {num_samples} random queries, q, k ~ N(0, I_H)")
    print(
        f"{'H':>6} {'Var dot':>9} {'Var scaled':>11} {'max w dot':>10} {'max w scaled':>13}"
        f" {'H(w) dot':>9} {'H(w) scaled':>12}"
    )
    for head_dim in (4, 16, 64, 256, 1024):
        kq, kk = jax.random.split(jax.random.key(head_dim))
        q = jax.random.normal(kq, (num_samples, 1, head_dim))
        k = jax.random.normal(kk, (num_samples, num_keys, head_dim))
        row = [head_dim]
        stats = [_softmax_stats(fn(q, k)) for fn in (dot, scaled_dot)]
        row += [s[0] for s in stats] + [s[1] for s in stats] + [s[2] for s in stats]
        print("{:>6} {:>9.1f} {:>11.3f} {:>10.3f} {:>13.3f} {:>9.3f} {:>12.3f}".format(*row))
    print(f"(uniform weights: max w = {1 / num_keys:.3f}, entropy = {math.log(num_keys):.3f} nats)")

    print("\nattention vs jax.nn.dot_product_attention (B=2, T=S=128, N=8, K=2, H=64, causal)")
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 128, 8, 64))
    k, v = (jax.random.normal(key, (2, 128, 2, 64)) for key in keys[1:])
    ours = jax.jit(lambda q, k, v: attention(q, k, v, is_causal=True))(q, k, v)
    ref = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    print(f"max |difference| = {float(jnp.max(jnp.abs(ours - ref))):.2e}")


def _softmax_stats(logits: jax.Array) -> tuple[float, float, float]:
    """Variance of the logits, mean largest softmax weight, mean entropy (nats)."""
    weights = jax.nn.softmax(logits, axis=-1)
    entropy = -jnp.sum(weights * jnp.log(jnp.maximum(weights, 1e-30)), axis=-1)
    return float(jnp.var(logits)), float(weights.max(-1).mean()), float(entropy.mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="attnjax", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="scaling and saturation of dot-product scores; parity check")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo()


if __name__ == "__main__":
    main()
