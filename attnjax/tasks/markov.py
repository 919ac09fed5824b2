"""Synthetic Markov-chain language whose best achievable loss is known exactly.

An order-``n`` chain over ``V = vocab_size`` tokens: each context (the last ``n = order`` tokens,
``S = V^n`` contexts) has ``num_successors`` possible next tokens, a uniform random subset, with
probabilities drawn from ``Dirichlet(concentration)``; all drawn with numpy from ``seed``, so the
config fixes the language. Each sequence starts from the chain's stationary distribution ``π``
over contexts, so every position is stationary.

Int inputs ``[B, T]`` are ``x_0 … x_{T-1}`` (``T = seq_len``), targets the next tokens
``x_1 … x_T``; ``loss_mask`` marks positions ``t >= n - 1``, where the whole context is in view
(earlier targets are 0).
Vocabulary and classes: ``V``.

``spec.baselines`` holds exact values, in nats per ``loss_mask`` position:

- ``entropy_rate`` ``= Σ_c π_c H(P(· | c))``: the best achievable expected loss;
- ``bigram_loss`` ``= H(x_{t+1} | x_t)``: the best model that sees only the current token (equal
  to the entropy rate when ``order = 1``, so use ``order >= 2`` for a bigram baseline that
  attention must beat);
- ``unigram_loss`` ``= H(x_t)``: the best model that ignores the context;
- ``optimal_accuracy`` ``= Σ_c π_c max_b P(b | c)``.

Chance: the most frequent token's probability (the best constant prediction). ``π`` comes from
power iteration of the lazy chain ``(P + I)/2`` (stationary for the same ``π``, and aperiodic)
until the L1 change is below 1e-13.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int, PRNGKeyArray

from attnjax.tasks import base

MAX_CONTEXTS = 2**16


class Chain(NamedTuple):
    """The chain's tables (numpy): the next token of context ``c`` is ``successors[c, j]`` with
    probability ``probs[c, j]``; context ``c`` is the base-``V`` number of the last ``order``
    tokens (oldest most significant); ``stationary[c]`` is ``π_c``."""

    successors: Int[np.ndarray, "S K"]
    probs: Float[np.ndarray, "S K"]
    stationary: Float[np.ndarray, " S"]


@dataclasses.dataclass(frozen=True)
class MarkovConfig:
    vocab_size: int = 32
    order: int = 2
    num_successors: int = 4
    concentration: float = 1.0
    seed: int = 0
    seq_len: int = 64

    def __post_init__(self):
        base.check_int(self, "vocab_size", 2)
        base.check_int(self, "order", 1)
        base.check_that(
            self,
            "order",
            self.vocab_size**self.order <= MAX_CONTEXTS,
            "with vocab_size**order <= 2**16",
        )
        base.check_int(self, "num_successors", 1, self.vocab_size)
        base.check_float(self, "concentration", 0.0, open_low=True)
        base.check_int(self, "seed", 0)
        base.check_int(self, "seq_len", self.order)

    @property
    def spec(self) -> base.TaskSpec:
        table = chain(self)
        marginal = _token_marginal(table, self.vocab_size)
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=float(marginal.max()),
            vocab_size=self.vocab_size,
            baselines={
                "entropy_rate": float(table.stationary @ _entropy(table.probs)),
                "bigram_loss": _bigram_loss(table, self.vocab_size),
                "unigram_loss": float(_entropy(marginal)),
                "optimal_accuracy": float(table.stationary @ table.probs.max(axis=1)),
            },
        )


def _entropy(p: Float[np.ndarray, "*N K"]) -> Float[np.ndarray, "*N"] | float:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _next_contexts(successors: Int[np.ndarray, "S K"], vocab_size: int) -> Int[np.ndarray, "S K"]:
    num_contexts = successors.shape[0]
    return (
        np.arange(num_contexts)[:, None] % (num_contexts // vocab_size)
    ) * vocab_size + successors


def _token_marginal(table: Chain, vocab_size: int) -> Float[np.ndarray, " V"]:
    return np.bincount(
        np.arange(len(table.stationary)) % vocab_size, table.stationary, minlength=vocab_size
    )


def _bigram_loss(table: Chain, vocab_size: int) -> float:
    """``H(x_t, x_{t+1}) - H(x_t)`` under ``π``."""
    current = np.arange(len(table.stationary))[:, None] % vocab_size
    joint = np.zeros((vocab_size, vocab_size))
    np.add.at(
        joint,
        (np.broadcast_to(current, table.successors.shape), table.successors),
        table.stationary[:, None] * table.probs,
    )
    return float(_entropy(joint.ravel()) - _entropy(joint.sum(axis=1)))


@functools.cache
def chain(config: MarkovConfig) -> Chain:
    """The chain ``config`` defines (cached per config)."""
    rng = np.random.default_rng(config.seed)
    num_contexts, k = config.vocab_size**config.order, config.num_successors
    successors = np.argsort(rng.random((num_contexts, config.vocab_size)), axis=1)[:, :k]
    probs = rng.dirichlet(np.full(k, config.concentration), size=num_contexts)
    next_contexts = _next_contexts(successors, config.vocab_size).ravel()
    pi = np.full(num_contexts, 1.0 / num_contexts)
    for _ in range(100_000):
        flow = np.bincount(next_contexts, (pi[:, None] * probs).ravel(), minlength=num_contexts)
        new = 0.5 * (pi + flow)
        if np.abs(new - pi).sum() < 1e-13:
            return Chain(successors, probs, new / new.sum())
        pi = new
    raise ValueError(f"MarkovConfig.seed: no stationary distribution found for {config}")


def generate(key: PRNGKeyArray, batch_size: int, config: MarkovConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    table = chain(config)
    vocab, order, seq_len = config.vocab_size, config.order, config.seq_len
    num_contexts = vocab**order
    k_start, k_steps = jax.random.split(key)
    context = jax.random.choice(k_start, num_contexts, (batch_size,), p=table.stationary)
    first = (context[:, None] // vocab ** np.arange(order - 1, -1, -1)) % vocab
    with np.errstate(divide="ignore"):
        log_probs = jnp.asarray(np.log(table.probs), jnp.float32)
    successors = jnp.asarray(table.successors, jnp.int32)

    def step(context, key):
        token = successors[context, jax.random.categorical(key, log_probs[context])]
        return (context % (num_contexts // vocab)) * vocab + token, token

    _, rest = jax.lax.scan(step, context, jax.random.split(k_steps, seq_len + 1 - order))
    tokens = jnp.concatenate([first, rest.T], axis=1).astype(jnp.int32)
    mask = jnp.broadcast_to(jnp.arange(seq_len) >= order - 1, (batch_size, seq_len))
    return {
        "inputs": tokens[:, :-1],
        "targets": jnp.where(mask, tokens[:, 1:], 0),
        "loss_mask": mask,
    }


TASK = base.Task("markov", MarkovConfig, generate)
