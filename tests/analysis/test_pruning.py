import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnjax import nn, tasks
from attnjax.analysis import pruning

TASK = tasks.get("xor_relation")
CONFIG = TASK.config(encoding="embedding")
BATCH = TASK.generate(jax.random.key(0), 8, CONFIG)


@pytest.fixture
def model():
    spec = CONFIG.spec
    config = nn.ModelConfig(kind="transformer", width=16, layers=2, heads=4,
                            vocab_size=spec.vocab_size, num_classes=spec.num_classes)  # fmt: skip
    return nn.build(config, nnx.Rngs(0))


def _loss(model):
    return float(TASK.loss(model(BATCH), BATCH))


def test_gates_round_trip_and_zero_gates_remove_attention(model):
    gates = pruning.get_gates(model)
    np.testing.assert_array_equal(gates, np.ones(8))
    pruning.set_gates(model, jnp.arange(8.0))
    np.testing.assert_array_equal(pruning.get_gates(model), np.arange(8.0))


def test_head_with_zero_values_has_zero_importance_and_pruning_it_changes_nothing(model):
    layer = model.encoder.blocks[0].attention
    layer.value.kernel[:, 2] = 0.0
    layer.value.bias[2] = 0.0
    importance = pruning.gradient_importance(model, BATCH, TASK.loss)
    assert importance.shape == (8,) and importance[2] == 0.0 and (importance[:2] > 0).all()
    before = model(BATCH)
    pruning.set_gates(model, jnp.ones(8).at[2].set(0.0))
    np.testing.assert_allclose(model(BATCH), before, atol=1e-6)


def test_gradient_importance_is_mean_absolute_per_example_gradient(model):
    importance = pruning.gradient_importance(model, BATCH, TASK.loss)

    def example_grad(i):  # flax's own gradient with respect to the gates, one example
        example = jax.tree.map(lambda x: x[i : i + 1], BATCH)
        grads = nnx.grad(
            lambda m: TASK.loss(m(example), example), argnums=nnx.DiffState(0, nn.HeadGate)
        )(model)
        return np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])

    grads = [example_grad(i) for i in range(8)]
    np.testing.assert_allclose(importance, np.mean(np.abs(grads), 0), rtol=1e-4, atol=1e-7)


def test_pruning_curve_runs_from_zero_to_all_and_restores_gates(model):
    curve = pruning.pruning_curve(
        model, _loss, lambda m: pruning.gradient_importance(m, BATCH, TASK.loss), step_fraction=0.25
    )
    assert [f for f, _ in curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    np.testing.assert_allclose(curve[0][1], _loss(model), rtol=1e-6)
    random_curve = pruning.pruning_curve(model, _loss, key=jax.random.key(1), step_fraction=0.5)
    assert len(random_curve) == 3 and random_curve[-1][1] == pytest.approx(curve[-1][1], 1e-5)
    np.testing.assert_array_equal(pruning.get_gates(model), np.ones(8))


def test_entropy_redundancy_scores_identical_heads_as_redundant(model):
    scores = pruning.entropy_redundancy_importance(model, BATCH)
    assert scores.shape == (8,) and np.isfinite(scores).all()
    layer = model.encoder.blocks[1].attention
    for name in ("query", "key"):
        projection = getattr(layer, name)
        projection.kernel[:, 1] = projection.kernel[:, 0]
        projection.bias[1] = projection.bias[0]
    scores = pruning.entropy_redundancy_importance(model, BATCH)
    assert scores[4] == pytest.approx(scores[5]) and scores[4] < scores[6:].min()


def test_attention_maps_are_each_layers_weights_and_leave_the_switch_off(model):
    maps = pruning.attention_maps(model, BATCH)
    seq_len = BATCH["inputs"].shape[1]
    assert [m.shape for m in maps] == [(8, 4, seq_len, seq_len)] * 2
    block = model.encoder.blocks[0]
    _, first = block.attention(block.attention_norm(model.embed(BATCH["inputs"])),
                               return_weights=True)  # fmt: skip
    np.testing.assert_allclose(maps[0], first, atol=1e-6)
    assert not any(b.attention.sow_weights for b in model.encoder.blocks)
