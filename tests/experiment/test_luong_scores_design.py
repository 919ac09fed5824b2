"""luong_scores (S3): the rule's outcomes on constructed seeds (guard, pairing by seed,
bootstrap), the margin, the model's construction (two LSTMs, no projections, s ≤ t, general =
dot at step 0)."""

import dataclasses
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnjax import tasks
from attnjax.experiment import load_file
from attnjax.experiment.recompute import Differs
from tests.experiment.conftest import EXPERIMENTS

luong = load_file(EXPERIMENTS / "luong_scores.py")

BASE = [1.0, 1.2, 0.9, 1.1, 1.05]
SIGNS = [1, -1, 1, -1, 0.5]


def values(dot, general=BASE, dot_drop=0.0, general_drop=0.0):
    n = len(dot)
    return luong.Paired(tuple(range(n)), np.array(dot), np.array(general),
                        np.full(n, dot_drop), np.full(n, general_drop))  # fmt: skip


def shifted(shift, noise=0.01):
    return [b + shift + noise * s for b, s in zip(BASE, SIGNS, strict=True)]


@pytest.mark.parametrize(
    ("shift", "noise", "expected"),
    [
        (0.0, 0.001, "tie"),  # differences within ±δ, tightly
        (-0.2, 0.01, "dot"),  # dot lower on every seed
        (0.2, 0.01, "general"),
        (0.0, 0.3, "undetermined"),  # too noisy for either
    ],
)
def test_outcome_reaches_every_label(shift, noise, expected):
    assert luong.outcome(values(shifted(shift, noise)), delta=0.05) == expected


def test_small_significant_difference_within_margin_is_a_tie():
    dot = [b - 0.01 for b in BASE]
    assert luong.outcome(values(dot), delta=0.05) == "tie"
    assert luong.outcome(values(dot), delta=0.005) == "dot"


def test_a_falling_curve_is_not_converged():
    general_wins = shifted(0.2)
    assert luong.outcome(values(general_wins, dot_drop=0.04), delta=0.05) == "general"
    assert luong.outcome(values(general_wins, dot_drop=0.06), delta=0.05) == "not converged"
    assert luong.outcome(values(BASE, general_drop=0.06), delta=0.05) == "not converged"


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (("dot", "tie"), "supported"),
        (("dot", "dot"), "supported"),
        (("general", "tie"), "refuted"),
        (("general", "general"), "refuted"),
        (("tie", "tie"), "inconclusive"),
        (("dot", "general"), "inconclusive"),
        (("dot", "undetermined"), "inconclusive"),
        (("general", "not converged"), "inconclusive"),
    ],
)
def test_verdict_outcome_space(outcomes, expected):
    assert luong.verdict(dict(zip(luong.TASKS, outcomes, strict=True)))[0] == expected


def test_margins_are_two_percent_of_chance_loss():
    assert luong.margin("copy") == pytest.approx(0.02 * math.log(8))
    assert luong.margin("mqar") == pytest.approx(0.02 * math.log(32))


def _rows(dot, general):
    """Chosen-rate rows of one task, one per point and seed."""
    rows = []
    for point, losses in (("score=dot", dot), ("score=bilinear", general)):
        rows += [{"task": "copy", "point": point, "seed": s, "learning_rate": 0.01,
                  "test_loss": x, "valid_loss": x, "valid_loss_at_3q": x}
                 for s, x in enumerate(losses)]  # fmt: skip
    return rows


def test_values_pair_by_seed_whatever_the_row_order():
    rates = {"score=dot": 0.01, "score=bilinear": 0.01}
    rows = _rows(shifted(-0.2), BASE)
    in_order = luong.paired(rows, rates)
    random.Random(0).shuffle(rows)
    shuffled = luong.paired(rows, rates)
    assert np.array_equal(in_order.dot - in_order.general, shuffled.dot - shuffled.general)
    with pytest.raises(Differs, match="other seeds"):
        luong.paired([r for r in rows if (r["point"], r["seed"]) != ("score=dot", 3)], rates)


def test_bootstrap_agreement_and_decisive_margins():
    clear = {"copy": values(BASE), "mqar": values(shifted(0.5))}  # tie, general: refuted
    assert luong.verdict({t: luong.outcome(v, luong.margin(t)) for t, v in clear.items()})[0] == (
        "refuted"
    )
    assert luong.bootstrap(clear) == 1.0
    assert luong.decisive_margin(clear["mqar"], 0.069) > 0.4
    noisy = {"copy": values(BASE), "mqar": values(shifted(0.1, noise=0.15))}
    assert luong.bootstrap(noisy) < luong.FRAGILE_BELOW
    assert luong.decisive_margin(values(shifted(0.0, 0.3)), 0.05) < 0  # undetermined: missed


def _model(score, seed=0):
    config = luong.base_config("copy", smoke=True)
    model_config = dataclasses.replace(config.model, score=score)
    batch = tasks.get("copy").generate(jax.random.key(seed), 2, config.task)
    return luong.GlobalAttentionLstm(model_config, rngs=nnx.Rngs(seed)), batch["inputs"]


def test_general_starts_as_dot_and_the_check_can_fail():
    assert luong.same_at_init()
    dot, inputs = _model("dot")
    general, _ = _model("bilinear")
    assert jnp.allclose(dot({"inputs": inputs}), general({"inputs": inputs}), atol=1e-6)
    general.w[...] = general.w[...] * 3.0  # a trained W: no longer the same function
    assert not jnp.allclose(dot({"inputs": inputs}), general({"inputs": inputs}), atol=1e-3)
    params = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(general, nnx.Param))}
    assert not any("query" in p or "key" in p for p in params)  # no q/k projections


def test_decoder_queries_attend_encoder_states_up_to_t():
    model, inputs = _model("bilinear")
    x = model.embed(inputs)
    zeros = jnp.zeros((2, 32))
    keys = model.encoder(x, initial_carry=(zeros, zeros))
    queries = model.decoder(x, initial_carry=(zeros, zeros))
    context = model.context(queries, keys)
    for t in range(6):  # c_t = Σ_{s≤t} softmax_s(h_tᵀ W h̄_s) h̄_s, W = I (unscaled)
        weights = jax.nn.softmax(jnp.einsum("bd,bsd->bs", queries[:, t], keys[:, : t + 1]))
        expected = jnp.einsum("bs,bsd->bd", weights, keys[:, : t + 1])
        assert jnp.allclose(context[:, t], expected, atol=1e-5)
    scores = jnp.einsum("btd,bsd->bts", queries, keys)  # dot's score matrix: two streams
    assert not jnp.allclose(scores, jnp.swapaxes(scores, 1, 2), atol=1e-3)
    config = luong.base_config("copy", smoke=True)
    with pytest.raises(ValueError, match="score"):
        luong.GlobalAttentionLstm(
            dataclasses.replace(config.model, score="scaled_dot"), rngs=nnx.Rngs(0)
        )


def test_pilot_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="pilot seeds"):
        luong.analyze(tmp_path, False, seeds=101)  # seeds 0-100 hold pilot seed 100
    with pytest.raises(ValueError, match="pilot seeds"):
        luong.report_from_rows({"results.csv": [{"task": "copy", "seed": 200}]})
