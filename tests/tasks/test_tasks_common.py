"""Properties every task shares: registry, jit, determinism, shapes, chance, loss, configs."""

import math

import chex
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from attnjax import tasks
from attnjax.tasks import base


def test_registry_lists_every_task():
    assert tasks.names() == (
        "automaton",
        "compression",
        "copy",
        "fuzzy_recall",
        "head_ordering",
        "impostor",
        "in_context_recall",
        "markov",
        "memorization",
        "min_of_keys",
        "mqar",
        "noisy_recall",
        "selective_copying",
        "xor_bits",
        "xor_relation",
    )
    for name in tasks.names():
        assert tasks.get(name).name == name


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown task 'nope'.*xor_relation"):
        tasks.get("nope")


@pytest.mark.parametrize("name", tasks.names())
def test_batch_matches_spec_and_is_deterministic(name, small):
    config, batch = small(name)
    spec = config.spec
    b, t = batch["targets"].shape
    assert t == spec.seq_len
    assert set(batch) == {"inputs", "targets", "loss_mask"}
    chex.assert_shape(batch["loss_mask"], (b, t))
    assert batch["targets"].dtype == np.int32 and batch["loss_mask"].dtype == np.bool_
    assert (spec.vocab_size is None) != (spec.num_features is None)
    if spec.vocab_size is not None:
        assert batch["inputs"].dtype == np.int32 and batch["inputs"].shape == (b, t)
        assert batch["inputs"].min() >= 0 and batch["inputs"].max() < spec.vocab_size
    else:
        assert batch["inputs"].dtype == np.float32
        assert batch["inputs"].shape == (b, t, spec.num_features)
    targets, mask = batch["targets"], batch["loss_mask"]
    assert targets.min() >= 0 and targets.max() < spec.num_classes
    assert np.all(targets[~mask] == 0) and mask.any(axis=1).all()

    _, again = small(name)
    _, other = small(name, seed=1)
    for k in batch:
        np.testing.assert_array_equal(batch[k], again[k])
    if name != "xor_bits":  # xor_bits has only four distinct examples
        assert not np.array_equal(batch["inputs"], other["inputs"])


@pytest.mark.parametrize("name", tasks.names())
def test_next_token_declarations_match_the_batches(name, small):
    """A task declares ``next_token`` iff its targets are its next inputs, over its vocabulary."""
    config, batch = small(name)
    spec = config.spec
    mask = batch["loss_mask"][:, :-1]
    follows = spec.num_classes == spec.vocab_size and np.array_equal(
        batch["targets"][:, :-1][mask], batch["inputs"][:, 1:][mask]
    )
    assert tasks.get(name).next_token == follows


@pytest.mark.parametrize("name", tasks.names())
def test_chance_is_the_most_frequent_target(name, small):
    draws = [small(name, seed=seed) for seed in range(2, 18)]
    config = draws[0][0]
    targets = np.concatenate([batch["targets"][batch["loss_mask"]] for _, batch in draws])
    freq = np.bincount(targets).max() / targets.size
    chance = config.spec.chance_accuracy
    assert abs(freq - chance) < 5 * math.sqrt(chance / targets.size) + 0.005, (freq, chance)


@pytest.mark.parametrize("name", tasks.names())
def test_loss_and_metrics_on_perfect_and_uniform_logits(name, small):
    task = tasks.get(name)
    config, batch = small(name)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    c = config.spec.num_classes
    perfect = 50.0 * jax.nn.one_hot(batch["targets"], c)
    metrics = task.metrics(perfect, batch)
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 1e-6
    assert float(task.loss(perfect, batch)) == pytest.approx(float(metrics["loss"]))
    uniform = jnp.zeros((*batch["targets"].shape, c))
    assert float(task.loss(uniform, batch)) == pytest.approx(math.log(c), rel=1e-5)


def test_loss_ignores_unmasked_positions():
    batch = {
        "targets": jnp.array([[0, 1]]),
        "loss_mask": jnp.array([[False, True]]),
    }
    logits = jnp.array([[[0.0, 9.0], [0.0, 9.0]]])  # wrong at the masked-out position only
    metrics = base.sequence_metrics(logits, batch)
    assert metrics["accuracy"] == 1.0 and metrics["sequence_accuracy"] == 1.0
    assert float(metrics["loss"]) == pytest.approx(math.log1p(math.exp(-9.0)), rel=1e-3)


BAD_CONFIGS = [
    ("xor_relation", "num_keys", 2),
    ("xor_relation", "num_values", 1.5),
    ("xor_relation", "encoding", "onehot"),
    ("min_of_keys", "num_keys", True),
    ("copy", "distance", 3),  # must exceed length (8)
    ("copy", "num_symbols", 1),
    ("impostor", "impostor_norm", 0.0),
    ("impostor", "impostor_cosine", 1.0),
    ("impostor", "impostor_norm", float("nan")),
    ("head_ordering", "num_items", 2),
    ("head_ordering", "num_orders", 0),
    ("head_ordering", "num_present", 16),  # must be below num_items (16)
    ("head_ordering", "num_present", 8),  # C(16, 8) * 4**8 cases to enumerate
    ("head_ordering", "num_values", 0),
    ("mqar", "seq_len", 63),
    ("mqar", "num_pairs", 17),  # 4 * 17 > seq_len 64
    ("mqar", "power_a", 0.0),
    ("mqar", "random_non_queries", 1),
    ("markov", "order", 4),  # 32**4 contexts
    ("markov", "num_successors", 33),
    ("markov", "concentration", -1.0),
    ("markov", "seq_len", 1),
    ("markov", "seed", "a"),
    ("in_context_recall", "seq_len", 15),
    ("in_context_recall", "frac_noise", 0.2),  # no noise vocabulary
    ("noisy_recall", "frac_noise", 1.0),
    ("noisy_recall", "vocab_size", 19),  # 16 noise tokens leave 3 for keys and values
    ("fuzzy_recall", "key_size", 8),  # 7 key tokens
    ("fuzzy_recall", "seq_len", 11),  # below two pairs of full motifs
    ("selective_copying", "seq_len", 33),  # must exceed 2 * 16 + 1
    ("compression", "vocab_size", 2),
    ("memorization", "seq_len", 31),
    ("automaton", "max_degree", 9),  # above alphabet_size (8)
    ("automaton", "num_states", 1),
    ("automaton", "max_length", 3),  # below min_length (4)
]


@pytest.mark.parametrize(("name", "field", "value"), BAD_CONFIGS)
def test_configs_reject_bad_values(name, field, value):
    """Our own error, or under jaxtyping's runtime checks a ``TypeCheckError`` naming the
    field for a value of the wrong type."""
    error = (ValueError, jaxtyping.TypeCheckError)
    with pytest.raises(error, match=rf"\.{field} must be|parameter '{field}'"):
        tasks.get(name).config(**{field: value})


def test_configs_are_frozen_and_hashable():
    config = tasks.get("head_ordering").config(num_items=5)
    assert config == tasks.get("head_ordering").config(num_items=5)
    assert hash(config) == hash(tasks.get("head_ordering").config(num_items=5))
    with pytest.raises(AttributeError):
        config.num_values = 3
