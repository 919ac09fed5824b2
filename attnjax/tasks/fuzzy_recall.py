"""Fuzzy in-context recall, after MAD (Poli et al., 2024; athms/mad-lab,
``generate_fuzzy_in_context_recall_instance`` with ``multi_query=True``): keys and values are
motifs of several tokens.

Tokens: keys ``[0, K)``, values ``[K, V - 1)`` and padding ``V - 1``, with ``V = vocab_size`` and
``K = (V - 1) // 2``. A key is ``1 … key_size`` distinct key tokens and a value ``1 …
value_size`` distinct value tokens, sizes and tokens uniform. A row of ``T + 1`` tokens
(``T = seq_len``) holds pairs ``key value`` while they fit in ``T + 1 - key_size - value_size``
tokens, then a last pair repeating a key-value pair drawn uniformly among them, left-padded to
``T + 1``. Each example keeps one value per key: a key's value is that of its first pair.
Int inputs ``[B, T]`` are the first ``T`` tokens, targets the next tokens, and the
``loss_mask`` marks the positions whose next token belongs to the value of a key seen in an
earlier pair (the last pair's always): next-token prediction scored where the answer is in
context. Vocabulary and classes: ``V``.

Chance: ``1 / (V - 1 - K)``; a target is a token of a uniform permutation of the value tokens,
so each value token is equally likely at each scored position.
No bag-of-tokens baseline: the Bayes-optimal order-blind readout needs the posterior over every
way the multiset of inputs splits into key and value motifs of varying sizes, which no closed
form or enumeration reaches at these sizes. Cheap order-blind rules bound it only from below,
and loosely: on in-context recall, where the ceiling is known exactly, rules guessing among the
tokens that occur a chosen number of times (chosen per position) reach less than half of it.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more pairs, same motifs).

Where attnjax differs: MAD trains on every next token and tests on recalled values with keys
at ``key_size`` tokens only; here both splits score the recalled values with keys of every size
(the atlas may test at full-size keys by setting ``key_size`` alone). MAD draws its repeated
pair on its own and inserts it at a uniform token offset; here it is one of the drawn pairs,
uniform among them.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class FuzzyRecallConfig:
    vocab_size: int = 16
    seq_len: int = 128
    key_size: int = 3
    value_size: int = 3

    def __post_init__(self):
        base.check_int(self, "vocab_size", 5)
        keys = (self.vocab_size - 1) // 2
        base.check_int(self, "key_size", 1, keys)
        base.check_int(self, "value_size", 1, self.vocab_size - 1 - keys)
        base.check_that(
            self, "key_size", (self.key_size + 1) * keys**self.key_size < 2**31, "small enough"
        )
        base.check_int(self, "seq_len", 2 * (self.key_size + self.value_size))

    @property
    def spec(self) -> base.TaskSpec:
        values = self.vocab_size - 1 - (self.vocab_size - 1) // 2
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=1 / values,
            vocab_size=self.vocab_size,
        )


def _motifs(key: PRNGKeyArray, count: int, size: int, low: int, high: int) -> jax.Array:
    """``count`` rows of ``size`` distinct tokens of ``[low, high)``, uniform."""
    order = jnp.argsort(jax.random.uniform(key, (count, high - low)), axis=1)
    return low + order[:, :size]


def generate(key: PRNGKeyArray, batch_size: int, config: FuzzyRecallConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, seq_len = config.vocab_size, config.seq_len
    kmax, vmax = config.key_size, config.value_size
    num_keys, pad = (vocab - 1) // 2, vocab - 1
    budget = seq_len + 1 - kmax - vmax  # tokens for the pairs before the last one
    slots = budget // 2

    def example(key):
        k_ks, k_vs, k_keys, k_values, k_last = jax.random.split(key, 5)
        key_len = jax.random.randint(k_ks, (slots,), 1, kmax + 1)
        value_len = jax.random.randint(k_vs, (slots,), 1, vmax + 1)
        keys = _motifs(k_keys, slots, kmax, 0, num_keys)
        values = _motifs(k_values, slots, vmax, num_keys, pad)
        # A key's code: its size and tokens as one int; its value is its first pair's.
        digits = jnp.where(jnp.arange(kmax)[None] < key_len[:, None], keys, 0)
        code = key_len * num_keys**kmax + digits @ (num_keys ** jnp.arange(kmax))
        first = jnp.argmax(code[:, None] == code[None, :], axis=1)
        value_len = value_len[first]
        ends = jnp.cumsum(key_len + value_len)
        fits = ends <= budget
        body = jnp.max(jnp.where(fits, ends, 0))
        last = jax.random.categorical(k_last, jnp.where(fits, 0.0, -1e9))
        end = seq_len + 1 - body - key_len[last] - value_len[last]  # padding before the body
        offset = jnp.arange(seq_len + 1) - end
        slot = jnp.sum(jnp.where(fits, ends, budget + 1)[None] <= offset[:, None], axis=1)
        in_body = slot < jnp.sum(fits)
        pair = jnp.where(in_body, slot, last)
        start = jnp.where(in_body, ends[slot % slots] - key_len[pair] - value_len[pair], body)
        within = offset - start
        is_value = within >= key_len[pair]
        value_token = values[first[pair], jnp.clip(within - key_len[pair], 0, vmax - 1)]
        token = jnp.where(is_value, value_token, keys[pair, jnp.clip(within, 0, kmax - 1)])
        token = jnp.where(offset < 0, pad, token)
        recalled = jnp.where(in_body, first[pair] < pair, True)
        scored = (offset >= 0) & is_value & recalled
        mask = scored[1:]
        return token[:-1], jnp.where(mask, token[1:], 0), mask

    inputs, targets, mask = base.split_examples(example, key, batch_size)
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": mask,
    }


TASK = base.Task("fuzzy_recall", FuzzyRecallConfig, generate, next_token=True)
