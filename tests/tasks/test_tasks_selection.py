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
    m, n, v = config.num_items, config.num_present, config.num_values
    subsets = set()
    for inputs, targets in zip(batch["inputs"], batch["targets"], strict=True):
        assert inputs[-1].tolist() == [0] * (m + v) + [1] and np.all(inputs[:n, -1] == 0)
        items = _one_hot_values(inputs[:n, :m]).tolist()
        values = dict(zip(items, _one_hot_values(inputs[:n, m : m + v]).tolist(), strict=True))
        assert len(values) == n
        target = 0
        for order in config.orders:
            top = next(i for i in order if i in values)
            target = target * v + values[top]
        assert targets[-1] == target
        subsets.add(frozenset(items))
    assert subsets == {frozenset(s) for s in itertools.combinations(range(m), n)}


def test_head_ordering_orders_are_fixed_permutations():
    from attnjax.tasks.head_ordering import HeadOrderingConfig

    four = HeadOrderingConfig(num_items=16, num_orders=4).orders
    assert four[0] == tuple(range(16)) and len(set(four)) == 4
    assert all(sorted(order) == list(range(16)) for order in four)
    assert HeadOrderingConfig(num_items=16, num_orders=2).orders == four[:2]
    # E5's second order, pinned: a change of numpy's permutation stream must not go unnoticed.
    assert four[1] == (2, 11, 3, 10, 0, 4, 7, 5, 14, 12, 6, 9, 13, 8, 1, 15)
    # On 3 items: 0≻1≻2 and 2≻0≻1, the claim's 1≻3≻2 and 2≻1≻3 with items 1, 3, 2 renamed 0, 1, 2.
    assert HeadOrderingConfig(num_items=3).orders == ((0, 1, 2), (2, 0, 1))


def test_head_ordering_chance_and_bag_ceiling_by_hand():
    from attnjax.tasks.head_ordering import HeadOrderingConfig

    # Pairs {0,1}: one shared top (1/2); {0,2}, {1,2}: two distinct tops (1/4).
    spec = HeadOrderingConfig(num_items=3, num_values=2).spec
    assert spec.chance_accuracy == (1 / 2 + 1 / 4 + 1 / 4) / 3
    # A pair's bag fixes the target when its two values are equal, else leaves two assignments.
    for v in (2, 4):
        spec = HeadOrderingConfig(num_items=6, num_values=v).spec
        assert spec.baselines["bag"] == 1 / v + (1 - 1 / v) / 2
    spec = HeadOrderingConfig(num_items=5, num_present=3, num_values=3).spec
    assert spec.chance_accuracy < spec.baselines["bag"] < 1


def test_impostor_offset_shifts_the_vectors_only(small):
    config, batch = small("impostor")
    _, shifted = small("impostor", offset=2.5)
    d = config.dim
    np.testing.assert_allclose(
        shifted["inputs"][..., :d], batch["inputs"][..., :d] + 2.5, atol=1e-5
    )
    np.testing.assert_array_equal(shifted["inputs"][..., d:], batch["inputs"][..., d:])
    np.testing.assert_array_equal(shifted["targets"], batch["targets"])
