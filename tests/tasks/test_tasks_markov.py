"""The Markov-chain language: its sequences follow the chain, and its exact losses are right."""

import itertools

import numpy as np
import pytest

from attnjax.tasks import markov


def _dense(config):
    """Transition matrix over contexts, built with loops from the chain's tables."""
    table = markov.chain(config)
    v, n = config.vocab_size, config.order
    contexts = list(itertools.product(range(v), repeat=n))
    index = {c: i for i, c in enumerate(contexts)}
    matrix = np.zeros((len(contexts), len(contexts)))
    for c in contexts:
        for token, p in zip(table.successors[index[c]], table.probs[index[c]], strict=True):
            matrix[index[c], index[(*c[1:], int(token))]] += p
    return contexts, matrix


def _entropy(p):
    return -sum(x * np.log(x) for x in p if x > 0)


def test_baselines_match_an_eigenvector_computation():
    config = markov.MarkovConfig(vocab_size=4, order=2, num_successors=2, seed=3)
    contexts, matrix = _dense(config)
    eigvals, eigvecs = np.linalg.eig(matrix.T)
    pi = np.real(eigvecs[:, np.argmin(np.abs(eigvals - 1))])
    pi /= pi.sum()
    np.testing.assert_allclose(markov.chain(config).stationary, pi, atol=1e-10)
    table = markov.chain(config)
    entropy_rate = sum(pi[i] * _entropy(table.probs[i]) for i in range(len(contexts)))
    joint = np.zeros((4, 4))
    for i, c in enumerate(contexts):
        for j, d in enumerate(contexts):
            joint[c[-1], d[-1]] += pi[i] * matrix[i, j]
    unigram = _entropy(joint.sum(axis=1))
    baselines = config.spec.baselines
    assert baselines["entropy_rate"] == pytest.approx(entropy_rate, abs=1e-10)
    assert baselines["bigram_loss"] == pytest.approx(_entropy(joint.ravel()) - unigram, abs=1e-10)
    assert baselines["unigram_loss"] == pytest.approx(unigram, abs=1e-10)
    assert config.spec.chance_accuracy == pytest.approx(joint.sum(axis=1).max(), abs=1e-10)
    assert entropy_rate < baselines["bigram_loss"] < unigram


def test_order_one_bigram_is_optimal():
    baselines = markov.MarkovConfig(order=1).spec.baselines
    assert baselines["bigram_loss"] == pytest.approx(baselines["entropy_rate"], abs=1e-10)


def test_sequences_follow_the_chain_at_the_entropy_rate(small):
    config, batch = small("markov")
    table = markov.chain(config)
    v, n = config.vocab_size, config.order
    nll = np.zeros(batch["targets"].shape)
    for b, (inputs, targets, mask) in enumerate(
        zip(batch["inputs"], batch["targets"], batch["loss_mask"], strict=True)
    ):
        for t in range(config.seq_len):
            assert mask[t] == (t >= n - 1)
            if mask[t]:
                context = sum(int(x) * v**i for i, x in enumerate(inputs[t - n + 1 : t + 1][::-1]))
                allowed = list(table.successors[context])
                assert targets[t] in allowed
                nll[b, t] = -np.log(table.probs[context, allowed.index(targets[t])])
            if t > 0 and mask[t - 1]:
                assert inputs[t] == batch["targets"][b, t - 1]
    per_sequence = nll[:, n - 1 :].mean(axis=1)
    stderr = per_sequence.std() / np.sqrt(len(per_sequence))
    assert abs(per_sequence.mean() - config.spec.baselines["entropy_rate"]) < 4 * stderr


def test_empirical_bigram_and_unigram_losses(small):
    draws = [small("markov", seed=seed)[1] for seed in range(8)]
    config = small("markov")[0]
    v = config.vocab_size
    counts = np.zeros((v, v))
    for batch in draws:
        np.add.at(counts, (batch["inputs"][:, 1:].ravel(), batch["targets"][:, 1:].ravel()), 1)
    joint = counts / counts.sum()
    unigram = _entropy(joint.sum(axis=1))
    bigram = _entropy(joint.ravel()) - unigram
    baselines = config.spec.baselines
    assert bigram == pytest.approx(baselines["bigram_loss"], abs=0.02)
    assert unigram == pytest.approx(baselines["unigram_loss"], abs=0.02)


def test_same_seed_same_language_other_seed_other_language():
    a, b = markov.MarkovConfig(seed=1), markov.MarkovConfig(seed=2)
    np.testing.assert_array_equal(
        markov.chain(a).probs, markov.chain(markov.MarkovConfig(seed=1)).probs
    )
    assert not np.array_equal(markov.chain(a).successors, markov.chain(b).successors)


def test_packed_documents_follow_the_chain_within_each_document():
    """``documents=3``: lengths >= order + 1 summing to seq_len, positions restarting per
    document, every loss position a chain transition from its own document's context, and
    the next input continuing the same document only."""
    import jax

    config = markov.MarkovConfig(vocab_size=6, order=2, num_successors=2, seq_len=24,
                                 documents=3)  # fmt: skip
    batch = jax.tree.map(np.asarray, markov.generate(jax.random.key(0), 16, config))
    table = markov.chain(config)
    v, n = config.vocab_size, config.order
    for b in range(16):
        segments, positions = batch["segment_ids"][b], batch["positions"][b]
        counts = np.bincount(segments, minlength=3)
        assert counts.sum() == 24 and counts.min() >= n + 1 and np.all(np.diff(segments) >= 0)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        np.testing.assert_array_equal(positions, np.arange(24) - starts[segments])
        for t in range(24):
            assert batch["loss_mask"][b, t] == (positions[t] >= n - 1)
            if batch["loss_mask"][b, t]:
                window = batch["inputs"][b, t - n + 1 : t + 1]
                context = sum(int(x) * v**i for i, x in enumerate(window[::-1]))
                assert batch["targets"][b, t] in table.successors[context]
            if t + 1 < 24 and segments[t + 1] == segments[t] and batch["loss_mask"][b, t]:
                assert batch["inputs"][b, t + 1] == batch["targets"][b, t]
    assert len({tuple(np.bincount(s, minlength=3)) for s in batch["segment_ids"]}) > 1
