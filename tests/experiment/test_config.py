import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.experiment import (
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    from_dict,
    parse_overrides,
    parse_typed,
    with_overrides,
)
from attnjax.experiment.trainer import optimizer


def test_model_io_fields_are_derived_from_the_task(smoke_config):
    model = smoke_config.model
    spec = smoke_config.task.spec
    assert model.embedding == "linear" and model.in_features == spec.num_features
    assert model.num_classes == spec.num_classes
    embedded = with_overrides(smoke_config, {"task.encoding": "embedding"})
    assert embedded.model.embedding == "tokens"
    assert embedded.model.vocab_size == embedded.task.spec.vocab_size


def test_dict_round_trip(smoke_config):
    config = with_overrides(smoke_config, {"model.score": "additive", "optim.clip_norm": 1.0})
    assert from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"model.nope": 1}, ValueError, "unknown field 'nope'"),
        ({"modle.heads": 2}, ValueError, "unknown section"),
        ({"heads": 2}, ValueError, "section.field"),
        ({"model.heads": "two"}, TypeError, "heads"),
        ({"model.score": "laplace"}, ValueError, "score"),
        ({"optim.learning_rate": -1.0}, ValueError, "learning_rate"),
        ({"optim.learning_rate": True}, TypeError, "learning_rate"),
        ({"train.steps": 25}, ValueError, "multiple of eval_every"),
        ({"train.diversity": "max"}, ValueError, "diversity"),
        ({"task.num_keys": 1}, ValueError, "num_keys"),
    ],
)
def test_bad_overrides_raise_naming_the_field(smoke_config, overrides, error, match):
    with pytest.raises(error, match=match):
        with_overrides(smoke_config, overrides)


def test_sections_validate_on_construction():
    with pytest.raises(ValueError, match="schedule"):
        OptimConfig(schedule="linear")
    with pytest.raises(TypeError, match="batch_size"):
        TrainConfig(batch_size=3.5)
    with pytest.raises(TypeError, match="task"):
        ExperimentConfig(name="x", task=object(), model={})
    assert dataclasses.is_dataclass(OptimConfig())


def test_set_values_are_parsed_by_the_fields_declared_type(smoke_config):
    pairs = [
        "model.causal=true", "model.norms=False", "optim.clip_norm=none", "train.steps=1_000",
        "optim.learning_rate=3e-4", "model.score=additive", "model.head_dim=null",
        "model.score_hidden=16", "name=my run",
    ]  # fmt: skip
    assert parse_overrides(smoke_config, pairs) == {
        "model.causal": True, "model.norms": False, "optim.clip_norm": None,
        "train.steps": 1000, "optim.learning_rate": 3e-4, "model.score": "additive",
        "model.head_dim": None, "model.score_hidden": 16, "name": "my run",
    }  # fmt: skip
    assert isinstance(parse_overrides(smoke_config, ["optim.learning_rate=1"])[
        "optim.learning_rate"], float)  # fmt: skip
    assert parse_typed("(1, 2)", tuple[int, ...]) == (1, 2)
    assert parse_typed("0.5,2", tuple[float, float]) == (0.5, 2.0)
    assert parse_typed("__import__('os').getcwd()", str) == "__import__('os').getcwd()"


@pytest.mark.parametrize(
    "pair, match",
    [
        ("model.causal=maybe", r"--set model.causal: expected true or false, got 'maybe'"),
        ("model.heads=2.5", r"--set model.heads: expected int, got '2.5'"),
        ("optim.clip_norm=big", r"--set optim.clip_norm: expected float \| None"),
        ("model.sccore=dot", r"unknown field 'sccore' of model"),
        ("model.heads", r"expected section.field=value"),
    ],
)
def test_bad_set_values_name_the_field_and_the_expected_type(smoke_config, pair, match):
    with pytest.raises(ValueError, match=match):
        parse_overrides(smoke_config, [pair])


def test_sgd_steps_along_the_negative_gradient_decay_spares_vectors_and_adamw_is_default():
    params = {"w": jnp.array([[1.0, -2.0]]), "b": jnp.array([3.0])}
    grads = {"w": jnp.array([[0.5, 4.0]]), "b": jnp.array([-1.0])}
    sgd = optimizer(OptimConfig(optimizer="sgd", weight_decay=0.1), steps=10)
    updates, _ = sgd.update(grads, sgd.init(params), params)
    np.testing.assert_allclose(updates["w"], -(grads["w"] + 0.1 * params["w"]), rtol=1e-6)
    np.testing.assert_allclose(updates["b"], -grads["b"], rtol=1e-6)  # vectors: no decay
    every = optimizer(OptimConfig(optimizer="sgd", weight_decay=0.1, decay_all=True), steps=10)
    updates, _ = every.update(grads, every.init(params), params)
    np.testing.assert_allclose(updates["b"], -(grads["b"] + 0.1 * params["b"]), rtol=1e-6)
    adam = optimizer(OptimConfig(), steps=10)
    updates, _ = adam.update(grads, adam.init(params), params)
    np.testing.assert_allclose(updates["w"], -jnp.sign(grads["w"]), rtol=1e-3)  # first step
    with pytest.raises(ValueError, match="optimizer"):
        OptimConfig(optimizer="lion")


def test_models_record_their_task_so_generate_refuses_one_that_is_not_next_token():
    """mqar's classes are its vocabulary, so only the recorded task tells generate that its
    predictions are not next tokens."""
    import importlib.util
    import pathlib

    import jax
    from flax import nnx

    from attnjax import nn

    path = pathlib.Path(__file__).parents[2] / "configs" / "mqar.py"
    spec = importlib.util.spec_from_file_location("mqar_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = with_overrides(module.get_config(), {"model.layers": 1, "model.width": 16})
    assert (config.model.task, config.model.next_token) == ("mqar", False)
    assert config.model.num_classes == config.model.vocab_size
    model = nn.build(config.model, nnx.Rngs(0))
    with pytest.raises(ValueError, match="built for task 'mqar', which is not next-token"):
        nn.generate(model, jnp.zeros((1, 2), jnp.int32), 2, key=jax.random.key(0))
