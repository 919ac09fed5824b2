"""The S8 experiment's model, measurements and verdict rule on constructed inputs."""

import pathlib

import numpy as np
import pytest
from flax import nnx

from attnjax import nn
from attnjax.experiment import Stats, Summary, load_file
from attnjax.experiment.config import with_overrides
from attnjax.experiment.sweep import point_key
from attnjax.experiment.trainer import get_trainer

S8 = load_file(pathlib.Path(__file__).parents[2] / "experiments" / "activation.py")


def _model(point):
    config = with_overrides(S8.base_config(smoke=True), point)
    return nn.build(config.model, nnx.Rngs(0)), get_trainer(config).eval_batch(0, "test")


def test_tanh_without_bias_negates_the_scores_of_mirrored_inputs():
    for point, odd in ((S8.TANH_NONE, True), (S8.RELU_PLUS, False)):
        model, batch = _model(point)
        q, k, _ = model.split(batch["inputs"])
        logits, mirrored = model.score.logits(q, k), model.score.logits(-q, -k)
        assert np.allclose(mirrored, -logits, atol=1e-6) == odd


def test_hidden_stats_of_extreme_biases():
    model, batch = _model(S8.RELU_PLUS)
    model.score.b[...] = np.full_like(model.score.b[...], -100.0)
    stats = S8.hidden_stats(model, batch)
    assert stats["dead per query"] == stats["dead everywhere"] == stats["saturated"] == 1.0
    model.score.b[...] = np.full_like(model.score.b[...], 100.0)
    stats = S8.hidden_stats(model, batch)
    assert stats["dead per query"] == stats["dead everywhere"] == 0.0
    assert 0.0 <= stats["entropy / log S"] <= 1.0 + 1e-6


def _inputs(accuracy, saturated, dead, entropy0=0.95):
    """A summary and init/trained stats: ``accuracy`` and ``saturated``/``dead`` per point."""
    summary = Summary([
        (p, Stats(accuracy[i], 0.01, (accuracy[i],) * 5, 1e-2, 0))
        for i, p in enumerate(S8.POINTS)
    ])  # fmt: skip
    init, trained = {}, {}
    for i, p in enumerate(S8.POINTS):
        stats = {"entropy / log S": entropy0, "saturated": saturated[i],
                 "dead per query": dead[i], "dead everywhere": 0.0}  # fmt: skip
        init[point_key(p)] = trained[point_key(p)] = stats
    return summary, init, trained


# Points: tanh none, tanh bias, offset none, offset bias, relu none, relu zero, relu +1.
GOOD = ([0.5, 0.9, 0.8, 0.9, 0.8, 0.8, 0.9], [0, 0, 0.6, 0.2, 0, 0, 0], [0, 0, 0, 0, 0.2, 0.2, 0])


@pytest.mark.parametrize(
    ("accuracy", "saturated", "dead", "entropy0", "expected"),
    [
        (*GOOD, 0.95, "supported"),
        (*GOOD, 0.5, "refuted"),  # (a): not near uniform at init
        ([0.9, 0.5, *GOOD[0][2:]], *GOOD[1:], 0.95, "refuted"),  # (a): the bias hurts
        (GOOD[0], [0, 0, 0.2, 0.6, 0, 0, 0], GOOD[2], 0.95, "refuted"),  # (b)
        (*GOOD[:2], [0, 0, 0, 0, 0.0, 0, 0], 0.95, "refuted"),  # (c): no dead units
        ([0.5, 0.52, *GOOD[0][2:]], *GOOD[1:], 0.95, "inconclusive"),  # (a): within noise
        (GOOD[0], [0, 0, 0.6, 0.58, 0, 0, 0], GOOD[2], 0.95, "inconclusive"),  # (b): small
    ],
)
def test_verdict_judges_every_part(accuracy, saturated, dead, entropy0, expected):
    verdict, reason = S8.verdict(*_inputs(accuracy, saturated, dead, entropy0))
    assert verdict == expected
    assert sum(reason.count(f": {v}") for v in ("supported", "refuted", "inconclusive")) == 3
