"""In-context recall and noisy in-context recall, after MAD (Poli et al., 2024; athms/mad-lab,
``generate_in_context_recall_instance`` with ``multi_query=True``, as its benchmark runs it).

Tokens: keys ``[0, K)``, values ``[K, V - N)`` and noise ``[V - N, V)``, with ``V = vocab_size``,
``N = noise_vocab_size`` and ``K = (V - N) // 2``. Each example draws a key-value map (every key
a uniform value) and fills ``T = seq_len`` positions with ``T / 2`` pairs ``k v``: keys uniform,
each followed by its value; each pair but the last becomes two uniform noise tokens with
probability ``frac_noise``, except one pair drawn among them, kept so the last pair has a key to
repeat. The last pair's key is uniform over the distinct keys of the real pairs before it.
Int inputs ``[B, T]``; the ``loss_mask`` marks each key position whose key appeared in an
earlier real pair, with its value (the next input) as target: next-token prediction, scored
where the answer is in context. Vocabulary and classes: ``V``.

Chance: ``1 / (V - N - K)``, values being uniform and independent of the keys.

:func:`bag_of_tokens_accuracy` (Monte Carlo over exact posteriors; :mod:`attnjax.tasks.bag`):
the accuracy of the Bayes-optimal order-blind readout, too slow for ``spec`` (for 2000 draws,
4-30 s at the atlas's levels, minutes at ``seq_len = 128``). At the key of pair ``j`` the
multiset of the inputs holds the keys of the real pairs so far (the current one among them), the
values of the real pairs before it and noise tokens, whose number says whether the current pair
is noise (then nothing is scored) and how many pairs are real; it does not say which key is
current nor which value belongs to which key. The noise is independent of the keys and values,
the real pairs' keys before the last are i.i.d. uniform and each key's value is uniform, so
given key counts ``a`` and value counts ``b``, the current key is ``c`` and the map is ``f``
with probability ``∝ a_c`` (the orderings of the keys that end in ``c``) if the values ``f``
gives the keys, each key ``k`` counted ``a_k`` times (less one for ``c``), have the counts
``b``, and 0 otherwise; for the last pair, whose key is uniform over the distinct keys seen
before, the same with ``a_c >= 2``. The position is scored when ``a_c >= 2``, with target
``f(c)``. Counting these maps exactly (keys grouped into values of the required counts) gives
``max_v P(scored, target = v | multiset)`` at every position; the function sums it over
``draws`` examples of the generator (key 0) and divides by their scored positions: the Bayes
accuracy up to the Monte Carlo error over multisets (its standard error given), with no error in
the posteriors.
Length extrapolation: :func:`attnjax.tasks.base.longer` (more pairs, same vocabulary).

Where attnjax differs: MAD trains on every next token and tests on the recalled values only;
here both train and test score the recalled values (the other targets are uniform draws no
model can predict). MAD's noise pairs are drawn per pair as here; its fixed-size example sets
(12 800 for training) are replaced by fresh draws at every step.
"""

import collections
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Int, PRNGKeyArray

from attnjax.tasks import bag, base


@dataclasses.dataclass(frozen=True)
class RecallConfig:
    vocab_size: int = 16
    seq_len: int = 128
    noise_vocab_size: int = 0
    frac_noise: float = 0.0

    def __post_init__(self):
        base.check_noise(self)
        base.check_int(self, "vocab_size", self.noise_vocab_size + 4)
        base.check_int(self, "seq_len", 4)
        base.check_that(self, "seq_len", self.seq_len % 2 == 0, "even")

    @property
    def spec(self) -> base.TaskSpec:
        clean = self.vocab_size - self.noise_vocab_size
        return base.TaskSpec(
            seq_len=self.seq_len,
            num_classes=self.vocab_size,
            chance_accuracy=1 / (clean - clean // 2),
            vocab_size=self.vocab_size,
        )


@dataclasses.dataclass(frozen=True)
class NoisyRecallConfig(RecallConfig):
    """MAD's noisy recall baseline: 16 noise tokens, a fifth of the pairs noise."""

    vocab_size: int = 32
    noise_vocab_size: int = 16
    frac_noise: float = 0.2


def generate(key: PRNGKeyArray, batch_size: int, config: RecallConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    vocab, seq_len = config.vocab_size, config.seq_len
    clean = vocab - config.noise_vocab_size
    num_keys, pairs = clean // 2, seq_len // 2

    def example(key):
        k_keys, k_map, k_noisy, k_kept, k_noise, k_last = jax.random.split(key, 6)
        keys = jax.random.randint(k_keys, (pairs,), 0, num_keys)
        values = jax.random.randint(k_map, (num_keys,), num_keys, clean)
        noisy = jax.random.bernoulli(k_noisy, config.frac_noise, (pairs,))
        kept = jax.random.randint(k_kept, (), 0, pairs - 1)
        noisy = noisy.at[kept].set(False).at[-1].set(False)
        real = ~noisy[:-1]
        seen = jnp.zeros(num_keys).at[keys[:-1]].add(real.astype(jnp.float32)) > 0
        keys = keys.at[-1].set(jax.random.categorical(k_last, jnp.where(seen, 0.0, -1e9)))
        noise = jax.random.randint(k_noise, (pairs, 2), clean, vocab)
        tokens = jnp.where(noisy[:, None], noise, jnp.stack([keys, values[keys]], axis=1))
        index = jnp.arange(pairs)
        before = (keys[:, None] == keys[None, :]) & ~noisy[None, :] & (index[None] < index[:, None])
        recalled = ~noisy & jnp.any(before, axis=1)
        mask = jnp.stack([recalled, jnp.zeros_like(recalled)], axis=1).reshape(seq_len)
        tokens = tokens.reshape(seq_len)
        return tokens, jnp.where(mask, jnp.roll(tokens, -1), 0), mask

    inputs, targets, mask = base.split_examples(example, key, batch_size)
    return {
        "inputs": inputs.astype(jnp.int32),
        "targets": targets.astype(jnp.int32),
        "loss_mask": mask,
    }


@functools.cache
def bag_of_tokens_accuracy(config: RecallConfig, draws: int = 2000) -> bag.Estimate:
    """The Bayes accuracy of an order-blind readout (module docstring), from ``draws``
    examples; cached per config."""
    batch = jax.jit(generate, static_argnums=(1, 2))(jax.random.key(0), draws, config)
    clean = config.vocab_size - config.noise_vocab_size
    best = _Posterior(clean - clean // 2).best_sums(np.asarray(batch["inputs"]), clean)
    return bag.ratio(best, np.asarray(batch["loss_mask"]).sum(axis=1).astype(float))


class _Posterior:
    """``max_v P(scored, target = v | multiset)`` at the keys of recall examples over
    ``num_values`` values, memoized (one instance per estimate, so the memo is freed)."""

    def __init__(self, num_values: int):
        self.num_values = num_values
        self.fills = functools.cache(self._fills)
        self.best = functools.cache(self._best)

    def best_sums(self, inputs: Int[np.ndarray, "D T"], clean: int) -> np.ndarray:
        """Per example ``[D]``, the sum of the posterior maxima over its real pairs' keys."""
        pairs = inputs.shape[1] // 2
        sums = np.zeros(len(inputs))
        for row, tokens in enumerate(inputs.tolist()):
            keys, values = collections.Counter(), collections.Counter()
            for j in range(pairs):
                key, value = tokens[2 * j], tokens[2 * j + 1]
                if key < clean:  # a real pair
                    keys[key] += 1
                    counts = tuple(sorted(keys.values())), tuple(sorted(values.values()))
                    sums[row] += self.best(*counts, j == pairs - 1)
                    values[value] += 1
        return sums

    def _best(self, keys: tuple[int, ...], values: tuple[int, ...], last: bool) -> float:
        """The posterior maximum given the key counts (the current key's among them) and the
        value counts; ``last``: the last pair, whose key was seen before."""
        total, mass = 0, collections.Counter()  # mass[b]: weight of one value counted b times
        for count, group in collections.Counter(keys).items():
            if last and count == 1:
                continue
            ways = self.fills(_by_weight(_take(keys, count, 1)), _take(values))
            total += group * count * ways * (self.num_values if count == 1 else 1)
            others = _by_weight(_take(keys, count, count))
            for b in set(values) if count > 1 else ():
                if b >= count - 1:  # the current key's value is counted count - 1 times, or more
                    mass[b] += group * count * self.fills(others, _take(values, b, count - 1))
        return max(mass.values(), default=0) / total

    def _fills(self, weights: tuple[int, ...], bins: tuple[int, ...]) -> int:
        """The number of ways to put distinct items, ``weights[w - 1]`` of weight ``w``, into
        distinct bins so that each bin holds exactly its size ``bins[i]`` (descending)."""
        if not bins:
            return int(not any(weights))
        total = 0
        for taken, ways in _subsets(weights, bins[0], len(weights)):
            rest = tuple(n - k for n, k in zip(weights, taken, strict=True))
            total += ways * self.fills(rest, bins[1:])
        return total


def _subsets(weights: tuple[int, ...], size: int, top: int):
    """Each choice of items of weight ``<= top`` (``weights`` as in ``_fills``) summing to
    ``size``: ``(taken per weight, the number of ways to choose them)``."""
    if top == 0:
        if size == 0:
            yield (), 1
        return
    for k in range(min(weights[top - 1], size // top) + 1):
        for taken, ways in _subsets(weights, size - k * top, top - 1):
            yield (*taken, k), ways * math.comb(weights[top - 1], k)


def _take(sizes: tuple[int, ...], size: int = 0, by: int = 0) -> tuple[int, ...]:
    """``sizes`` with one ``size`` lowered ``by`` (dropped at 0), in descending order."""
    rest = list(sizes)
    if by:
        rest.remove(size)
        rest.append(size - by)
    return tuple(sorted((s for s in rest if s), reverse=True))


def _by_weight(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """How many of ``sizes`` equal each weight ``1 … max(sizes)``."""
    return tuple(sizes.count(w) for w in range(1, max(sizes, default=0) + 1))


TASK = base.Task("in_context_recall", RecallConfig, generate, next_token=True)
NOISY_TASK = base.Task("noisy_recall", NoisyRecallConfig, generate, next_token=True)
