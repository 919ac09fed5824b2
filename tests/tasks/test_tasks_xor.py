"""XOR relation and XOR of two bits against brute-force decoding in Python."""

import pathlib

import numpy as np
import pytest


def _decode_xor_relation(config, inputs):
    """Per example: query bits, key bits and key values, read back from the encoding."""
    v = config.num_values
    if config.encoding == "linear":
        assert np.all(inputs[:-1, 2] == 0) and inputs[-1, 2] == 1
        assert np.all(inputs[-1, 3:] == 0) and np.all(inputs[:-1, 3:].sum(axis=1) == 1)
        bits = [(int(b1), int(b2)) for b1, b2 in inputs[:, :2]]
        return bits[-1], bits[:-1], list(inputs[:-1, 3:].argmax(axis=1))
    query = int(inputs[-1]) - 4 * v
    assert 0 <= query < 4 and all(int(t) < 4 * v for t in inputs[:-1])
    keys = [(int(t) // v // 2, int(t) // v % 2) for t in inputs[:-1]]
    return (query // 2, query % 2), keys, [int(t) % v for t in inputs[:-1]]


@pytest.mark.parametrize("encoding", ["linear", "embedding"])
def test_xor_relation_target_is_the_unique_one_bit_match(encoding, small):
    config, batch = small("xor_relation", encoding=encoding)
    kinds_seen = set()
    for inputs, targets, mask in zip(
        batch["inputs"], batch["targets"], batch["loss_mask"], strict=True
    ):
        query, keys, values = _decode_xor_relation(config, inputs)
        matches = [(k[0] == query[0]) + (k[1] == query[1]) for k in keys]
        assert matches.count(1) == 1 and 0 in matches and 2 in matches
        relevant = matches.index(1)
        assert targets[-1] == values[relevant]
        assert mask.tolist() == [False] * config.num_keys + [True]
        kinds_seen.add((query, keys[relevant]))
    assert len(kinds_seen) == 8  # every query with both of its relevant keys


def test_xor_bits_target_is_the_xor_at_equals(small):
    _, batch = small("xor_bits")
    seen = set()
    for inputs, targets, mask in zip(
        batch["inputs"], batch["targets"], batch["loss_mask"], strict=True
    ):
        b1, b2, eq = (int(x) for x in inputs)
        assert eq == 2 and b1 in (0, 1) and b2 in (0, 1)
        assert targets.tolist() == [0, 0, b1 != b2] and mask.tolist() == [False, False, True]
        seen.add((b1, b2))
    assert len(seen) == 4


def test_xor_bits_evaluates_on_each_input_once():
    from attnjax import tasks
    from attnjax.experiment import load_file
    from attnjax.experiment.trainer import Trainer

    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    pairs = [tuple(int(x) for x in row[:2]) for row in batch["inputs"]]
    assert sorted(pairs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [int(t[-1]) for t in batch["targets"]] == [a ^ b for a, b in pairs]
    root = pathlib.Path(__file__).parents[2]
    config = load_file(root / "configs" / "xor_bits.py").get_config("smoke")
    trainer = Trainer(config)
    for seed, split in ((0, "valid"), (3, "test")):
        assert np.array_equal(trainer.eval_batch(seed, split)["inputs"], batch["inputs"])
