"""In-context automaton learning, after RegBench (Akyürek et al., 2024, "In-Context Language
Learning: Architectures and Algorithms"): strings of a random automaton, a new one per example.

Each example draws an automaton from its key: an alphabet of ``alphabet_size`` symbols, uniform
among ``[0, num_symbols)``; ``num_states`` states, each with ``1 … max_degree`` outgoing edges
(uniform; the start state 0 has one, so every string opens with the same symbol and every row
has scored positions), labelled by distinct symbols of the alphabet and leading to uniform
states other than 0 (as in RegBench, the start state is never re-entered). Each string starts in
state 0 and follows a uniform outgoing edge per symbol; its length is uniform in ``[min_length,
max_length]``. Strings follow one another, each after a delimiter (token ``num_symbols``), from
position 0 until ``T + 1`` tokens (``T = seq_len``; the last string is cut). Edges leaving a
state carry distinct symbols, so a string's prefix fixes its state. Int inputs ``[B, T]`` are
the first ``T`` tokens, targets the next tokens. Scored positions (``loss_mask``): those whose
state has exactly one outgoing edge and whose string goes on, where the next symbol is
determined by the automaton; a model can only know it from the strings before. Vocabulary and
classes: ``num_symbols + 1``.

Metric: ``accuracy`` of the next symbol at the scored positions. Chance: ``1 / num_symbols``
exactly: the generator treats every symbol alike, so a scored target is uniform over them.
No bag-of-tokens baseline: the Bayes-optimal order-blind readout needs the posterior over the
automata and walks that give the symbol counts seen, which no closed form or enumeration reaches
at these sizes. Cheap order-blind rules bound it only from below, and loosely: on in-context
recall, where the ceiling is known exactly, rules guessing among the tokens that occur a chosen
number of times (chosen per position) reach less than half of it.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more strings of the same automaton).

Where attnjax differs: RegBench draws 4-12 states, alphabets of 4-18 of 20 symbols and 1-4
edges per state, trains on every next token and scores a prediction as right when it is any
legal next symbol (with the total variation distance to the automaton's distribution). A batch
here carries no legal sets, so only determined positions are scored, and trained on; sizes are
fixed per config (the atlas varies them as difficulty levels), the start state has a single
edge (RegBench's has 1-4), strings fill a row of fixed length and next states are drawn with
replacement.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class AutomatonConfig:
    num_symbols: int = 12
    alphabet_size: int = 8
    num_states: int = 6
    max_degree: int = 4
    min_length: int = 4
    max_length: int = 12
    seq_len: int = 128

    def __post_init__(self):
        base.check_int(self, "num_symbols", 2)
        base.check_int(self, "alphabet_size", 1, self.num_symbols)
        base.check_int(self, "num_states", 2)
        base.check_int(self, "max_degree", 1, self.alphabet_size)
        base.check_int(self, "min_length", 1)
        base.check_int(self, "max_length", self.min_length)
        base.check_int(self, "seq_len", 2)

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.num_symbols + 1,
            chance_accuracy=1 / self.num_symbols,
            vocab_size=self.num_symbols + 1,
        )


def automaton(key: PRNGKeyArray, config: AutomatonConfig) -> tuple[jax.Array, ...]:
    """One automaton: ``degree [S]``, ``symbols [S, D]`` and ``next_state [S, D]`` (edge ``j`` of
    state ``s`` exists for ``j < degree[s]``), ``S = num_states``, ``D = max_degree``."""
    states, d = config.num_states, config.max_degree
    k_alphabet, k_degree, k_labels, k_next = jax.random.split(key, 4)
    alphabet = jax.random.permutation(k_alphabet, config.num_symbols)[: config.alphabet_size]
    degree = jax.random.randint(k_degree, (states,), 1, d + 1).at[0].set(1)
    labels = jnp.argsort(jax.random.uniform(k_labels, (states, config.alphabet_size)), axis=1)
    next_state = jax.random.randint(k_next, (states, d), 1, states)
    return degree, alphabet[labels[:, :d]], next_state


def generate(key: PRNGKeyArray, batch_size: int, config: AutomatonConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    delimiter = config.num_symbols

    def example(key):
        k_automaton, k_first, k_walk = jax.random.split(key, 3)
        degree, symbols, next_state = automaton(k_automaton, config)

        def draw_length(key):
            return jax.random.randint(key, (), config.min_length, config.max_length + 1)

        def step(carry, key):
            state, left = carry
            k_edge, k_length = jax.random.split(key)
            edge = jax.random.randint(k_edge, (), 0, degree[state])
            ends = left == 0
            token = jnp.where(ends, delimiter, symbols[state, edge])
            state = jnp.where(ends, 0, next_state[state, edge])
            left = jnp.where(ends, draw_length(k_length), left - 1)
            return (state, left), (token, (degree[state] == 1) & (left > 0))

        first = (jnp.int32(0), draw_length(k_first))
        keys = jax.random.split(k_walk, config.seq_len)
        _, (tokens, determined) = jax.lax.scan(step, first, keys)
        tokens = jnp.concatenate([jnp.array([delimiter]), tokens])
        mask = jnp.concatenate([jnp.array([True]), determined[:-1]])
        return tokens[:-1], jnp.where(mask, tokens[1:], 0), mask

    inputs, targets, mask = base.split_examples(example, key, batch_size)
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": mask,
    }


TASK = base.Task("automaton", AutomatonConfig, generate, next_token=True)
