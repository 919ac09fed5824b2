"""The S8 experiment's model and measurements on constructed inputs."""

import pathlib

import numpy as np
from flax import nnx

from attnjax.experiment import load_file

S8 = load_file(pathlib.Path(__file__).parents[2] / "experiments" / "activation.py")


def test_hidden_stats_of_extreme_biases():
    model, batch = S8.build(S8.RELU_PLUS, 0, smoke=True)
    model.score.b[...] = np.full_like(model.score.b[...], -100.0)
    stats = S8.hidden_stats(model, batch)
    assert stats["dead per query"] == stats["dead for every input"] == stats["saturated"] == 1.0
    model.score.b[...] = np.full_like(model.score.b[...], 100.0)
    stats = S8.hidden_stats(model, batch)
    assert stats["dead per query"] == stats["dead for every input"] == 0.0
    assert 0.0 <= stats["entropy / log S"] <= 1.0 + 1e-6


def test_one_unit_dead_for_every_input_is_counted_once():
    """A unit whose bias is far below every pre-activation is dead for every input; the others
    (bias far above) are not: the fraction is 1 / A."""
    model, batch = S8.build(S8.RELU_PLUS, 0, smoke=True)
    b = np.full_like(model.score.b[...], 100.0)
    b[0, 0] = -100.0
    model.score.b[...] = b
    assert S8.hidden_stats(model, batch)["dead for every input"] == 1 / S8.HIDDEN


def test_the_model_logits_are_the_additive_scores():
    model, batch = S8.build(S8.RELU_PLUS, 0, smoke=True)
    q, k, _ = model.split(batch["inputs"])
    np.testing.assert_allclose(model.logits(q, k), model.score.logits(q, k), atol=1e-5)


def test_the_offset_is_frozen_without_a_bias_and_bs_start_with_one():
    """(b)'s points: the same constant c, a non-trained shift without a bias, b's initial value
    with one; the shift is not among the trained parameters."""
    frozen, _ = S8.build(S8.TANH_NONE, 0, smoke=True)
    learnable, _ = S8.build(S8.TANH_BIAS, 0, smoke=True)
    np.testing.assert_array_equal(frozen.shift[...], learnable.score.b[...])
    assert np.abs(frozen.shift[...]).max() > 2
    params = nnx.state(frozen, nnx.Param)
    assert "shift" not in params and "shift" in nnx.state(frozen)
