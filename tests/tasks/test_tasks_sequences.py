"""Copy and MQAR targets against brute force in Python."""

import itertools

import numpy as np


def test_copy_targets_repeat_the_symbols_after_distance(small):
    config, batch = small("copy")
    s, length, distance = config.num_symbols, config.length, config.distance
    for inputs, targets, mask in zip(
        batch["inputs"], batch["targets"], batch["loss_mask"], strict=True
    ):
        for t in range(distance + length):
            if t < length:
                assert inputs[t] < s and not mask[t]
            elif t == distance - 1:
                assert inputs[t] == s + 1 and not mask[t]
            else:
                assert inputs[t] == s
            if t >= distance:
                assert mask[t] and targets[t] == inputs[t - distance]


def _check_mqar(config, batch):
    half, pairs = config.vocab_size // 2, config.num_pairs
    context = 2 * pairs
    for inputs, targets, mask in zip(
        batch["inputs"], batch["targets"], batch["loss_mask"], strict=True
    ):
        keys, values = list(inputs[:context:2]), list(inputs[1:context:2])
        assert len(set(keys)) == pairs and len(set(values)) == pairs
        assert all(1 <= k < half for k in keys) and all(
            half <= x < config.vocab_size for x in values
        )
        queries = [t for t in range(len(inputs)) if mask[t]]
        assert len(queries) == pairs
        assert sorted(inputs[t] for t in queries) == sorted(keys)
        for t in queries:
            assert t >= context and (t - context) % 2 == 0
            hits = [i for i in range(0, context, 2) if inputs[i] == inputs[t]]
            assert len(hits) == 1 and targets[t] == inputs[hits[0] + 1]
        if not config.random_non_queries:
            assert all(inputs[t] == 0 for t in range(context, len(inputs)) if not mask[t])


def test_mqar_targets_are_the_values_of_the_queried_keys(small):
    for overrides in ({}, {"random_non_queries": False}):
        config, batch = small("mqar", **overrides)
        _check_mqar(config, batch)


def test_mqar_query_slots_follow_zoologys_power_law(small):
    """Slots are drawn one by one without replacement (numpy's ``choice``, as in Zoology), so a
    set of slots has probability ``Σ over orderings Π p_i / (1 - p of those drawn before)``."""
    draws = [small("mqar", seed=seed) for seed in range(8)]
    config = draws[0][0]
    context, space = 2 * config.num_pairs, (config.seq_len - 2 * config.num_pairs) // 2
    p = config.power_a * np.arange(1, space + 1) ** (config.power_a - 1)
    p /= p.sum()
    counts = {}
    for _, batch in draws:
        for mask in batch["loss_mask"]:
            slots = frozenset((np.flatnonzero(mask) - context) // 2)
            counts[slots] = counts.get(slots, 0) + 1
    total = sum(counts.values())
    for slots in itertools.combinations(range(space), config.num_pairs):
        prob = 0.0
        for order in itertools.permutations(slots):
            term, drawn = 1.0, 0.0
            for g in order:
                term *= p[g] / (1 - drawn)
                drawn += p[g]
            prob += term
        expected = total * prob
        observed = counts.get(frozenset(slots), 0)
        assert abs(observed - expected) < 5 * np.sqrt(expected) + 2, (slots, observed, expected)
