"""Min-of-keys, impostor and head-ordering targets against brute force in Python."""

import itertools

import numpy as np


def _one_hot_values(tokens):
    assert np.all(tokens.sum(axis=1) == 1)
    return tokens.argmax(axis=1)


def test_min_of_keys_target_maximizes_the_min(small):
    config, batch = small("min_of_keys")
    n = config.num_keys
    for inputs, targets in zip(batch["inputs"], batch["targets"], strict=True):
        assert inputs[-1].tolist() == [0, 0, 1] + [0] * config.num_values
        assert np.all(inputs[:n, 2] == 0) and np.all((inputs[:n, :2] >= 0) & (inputs[:n, :2] < 1))
        values = _one_hot_values(inputs[:n, 3:])
        best, best_min = None, -1.0
        for i in range(n):
            if min(inputs[i, 0], inputs[i, 1]) > best_min:
                best, best_min = i, min(inputs[i, 0], inputs[i, 1])
        assert targets[-1] == values[best]


def test_single_direction_accuracy_matches_the_task_batches(small):
    config, batch = small("min_of_keys", num_keys=8)
    keys = batch["inputs"][:, :-1, :2]
    measured = np.mean(keys.sum(-1).argmax(-1) == keys.min(-1).argmax(-1))
    limit = config.spec.baselines["single_direction_accuracy"]
    assert 0.7 < limit < 0.85
    assert abs(measured - limit) < 4 * np.sqrt(limit * (1 - limit) / len(keys))


def test_two_rankings_with_an_oracle_choice_beat_one_but_stay_far_from_solving():
    from attnjax.tasks.min_of_keys import single_direction_accuracy, two_direction_accuracy

    one, two = single_direction_accuracy(8), two_direction_accuracy(8)
    assert one + 0.03 < two < 0.9
    assert two_direction_accuracy(8, angles=4) <= two  # a coarser grid of pairs cannot do better


def test_impostor_target_is_the_exact_match(small):
    config, batch = small("impostor")
    n, d = config.num_keys, config.dim
    for inputs, targets in zip(batch["inputs"], batch["targets"], strict=True):
        query = inputs[-1, :d]
        assert (
            inputs[-1, d] == 1 and np.all(inputs[:n, d] == 0) and np.all(inputs[-1, d + 1 :] == 0)
        )
        values = _one_hot_values(inputs[:n, d + 1 :])
        norms = [float(np.linalg.norm(inputs[i, :d])) for i in range(n)]
        cosines = [float(inputs[i, :d] @ query) / norms[i] for i in range(n)]
        match = [i for i in range(n) if cosines[i] > 1 - 1e-5]
        impostor = [i for i in range(n) if abs(norms[i] - config.impostor_norm) < 1e-4]
        assert len(match) == 1 and len(impostor) == 1
        assert abs(norms[match[0]] - 1) < 1e-5 and abs(np.linalg.norm(query) - 1) < 1e-5
        assert abs(cosines[impostor[0]] - config.impostor_cosine) < 1e-5
        assert sum(abs(x - 1) < 1e-5 for x in norms) == n - 1
        assert targets[-1] == values[match[0]]


def test_head_ordering_target_is_each_orders_top_value(small):
    config, batch = small("head_ordering")
    m, v = config.num_items, config.num_values
    subsets = set()
    for inputs, targets in zip(batch["inputs"], batch["targets"], strict=True):
        assert inputs[-1] == m * v
        items = [int(t) // v for t in inputs[:-1]]
        values = {int(t) // v: int(t) % v for t in inputs[:-1]}
        assert len(set(items)) == config.num_present
        target = 0
        for order in config.orders:
            top = next(i for i in order if i in values)
            target = target * v + values[top]
        assert targets[-1] == target
        subsets.add(frozenset(items))
    assert subsets == {frozenset(s) for s in itertools.combinations(range(m), config.num_present)}


def test_head_ordering_chance_by_enumeration():
    from attnjax.tasks.head_ordering import HeadOrderingConfig

    # Subsets {0,1}, {1,2}: two distinct tops (1/16); {0,2}: one shared top (1/4).
    assert HeadOrderingConfig().spec.chance_accuracy == (2 / 16 + 1 / 4) / 3
    reverse = HeadOrderingConfig(orders=((0, 1, 2), (2, 1, 0)), num_values=3)
    assert reverse.spec.chance_accuracy == 1 / 9  # tops of an order and its reverse never meet
