"""Synthetic Markov-chain language whose best achievable loss is known exactly.

An order-``n`` chain over ``V = vocab_size`` tokens: each context (the last ``n = order`` tokens,
``S = V^n`` contexts) has ``num_successors`` possible next tokens, a uniform random subset, with
probabilities drawn from ``Dirichlet(concentration)``; all drawn with numpy from ``seed``, so the
config fixes the language. Each sequence starts from the chain's stationary distribution ``π``
over contexts, so every position is stationary.

Int inputs ``[B, T]`` are ``x_0 … x_{T-1}`` (``T = seq_len``), targets the next tokens
``x_1 … x_T``; ``loss_mask`` marks positions ``t >= n - 1``, where the whole context is in view
(earlier targets are 0).
Vocabulary and classes: ``V``. Next-token prediction: each target is the next token of its
sequence. With ``documents > 1`` a row packs several sequences, and the batch adds
``segment_ids [B, T]`` (each position's sequence) and ``positions [B, T]`` (restarting at 0 in
each sequence).

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
from jaxtyping import Array, Float, Int, PRNGKeyArray

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
    documents: int = 1  # > 1: each row packs this many independent sequences (see generate)

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
        base.check_int(self, "documents", 1, self.seq_len // (self.order + 1) or 1)

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
    """A batch as described in the module docstring. With ``documents > 1`` each row packs
    that many independent sequences (each from its own stationary start) of random lengths,
    at least ``order + 1``, summing to ``seq_len``; the batch adds ``segment_ids [B, T]`` (the
    document of each position) and ``positions [B, T]`` (restarting at 0 in each document),
    and ``loss_mask`` marks positions at least ``order - 1`` into their document."""
    order, seq_len, documents = config.order, config.seq_len, config.documents
    if documents == 1:
        tokens = _chains(key, batch_size, config)
        mask = jnp.broadcast_to(jnp.arange(seq_len) >= order - 1, (batch_size, seq_len))
        return {
            "inputs": tokens[:, :-1],
            "targets": jnp.where(mask, tokens[:, 1:], 0),
            "loss_mask": mask,
        }
    k_chains, k_lengths = jax.random.split(key)
    tokens = _chains(k_chains, batch_size * documents, config)
    tokens = tokens.reshape(batch_size, documents, seq_len + 1)
    lengths = _document_lengths(k_lengths, batch_size, documents, seq_len, order + 1)
    ends = jnp.cumsum(lengths, axis=1)
    segment = jnp.sum(jnp.arange(seq_len)[None, None] >= ends[:, :, None], axis=1)  # [B, T]
    starts = jnp.take_along_axis(ends - lengths, segment, axis=1)
    positions = jnp.arange(seq_len)[None] - starts
    rows = jnp.arange(batch_size)[:, None]
    mask = positions >= order - 1
    return {
        "inputs": tokens[rows, segment, positions],
        "targets": jnp.where(mask, tokens[rows, segment, positions + 1], 0),
        "loss_mask": mask,
        "segment_ids": segment.astype(jnp.int32),
        "positions": positions.astype(jnp.int32),
    }


def _chains(key: PRNGKeyArray, count: int, config: MarkovConfig) -> Int[Array, "n T1"]:
    """``count`` chains of ``seq_len + 1`` tokens, each from a stationary start."""
    table = chain(config)
    vocab, order, seq_len = config.vocab_size, config.order, config.seq_len
    num_contexts = vocab**order
    k_start, k_steps = jax.random.split(key)
    context = jax.random.choice(k_start, num_contexts, (count,), p=table.stationary)
    first = (context[:, None] // vocab ** np.arange(order - 1, -1, -1)[None]) % vocab
    with np.errstate(divide="ignore"):
        log_probs = jnp.asarray(np.log(table.probs), jnp.float32)
    successors = jnp.asarray(table.successors, jnp.int32)

    def step(context, key):
        token = successors[context, jax.random.categorical(key, log_probs[context])]
        return (context % (num_contexts // vocab)) * vocab + token, token

    _, rest = jax.lax.scan(step, context, jax.random.split(k_steps, seq_len + 1 - order))
    return jnp.concatenate([first, rest.T], axis=1).astype(jnp.int32)


def _document_lengths(
    key: PRNGKeyArray, batch_size: int, documents: int, total: int, minimum: int
) -> Int[Array, "B D"]:
    """Per row, ``documents`` lengths of at least ``minimum`` summing to ``total``: the spare
    positions split by uniform (Dirichlet(1)) proportions, the rounding left to the last."""
    spare = total - documents * minimum
    shares = jax.random.dirichlet(key, jnp.ones(documents), (batch_size,))
    split = jnp.floor(shares * spare).astype(jnp.int32)
    split = split.at[:, -1].add(spare - jnp.sum(split, axis=1))
    return minimum + split


TASK = base.Task("markov", MarkovConfig, generate, next_token=True)
