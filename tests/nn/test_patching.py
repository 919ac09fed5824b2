"""``attnjax.inspect``: activation patching against the causal structure and a direct
linear computation, direct logit attribution summing to the logits, head detectors on
hand-built patterns and on a model held to the previous token, and their figures laid out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attnjax.nn as ann
from attnjax import inspect as ai
from tests.experiment.test_report import assert_laid_out
from tests.nn.test_hooks import CLEAN, CONFIG, CORRUPT, B, T, _model

LINEAR = dataclasses.replace(CONFIG, layers=1, mlp=False, norms=False)


def first_logits(output, batch):
    """A metric linear in the output: the first position's logits, weighted."""
    return (output[:, 0] * jnp.arange(1.0, output.shape[-1] + 1)[None]).mean()


def last_logits(output, batch):
    return (output[:, -1] * jnp.arange(1.0, output.shape[-1] + 1)[None]).mean()


def test_patching_a_position_restores_exactly_what_the_causal_mask_lets_it():
    """The first position's output depends on each block's input at position 0 only:
    patching that cell from the clean run gives normalized 1, any later position 0."""
    table = ai.patch_positions(_model(), CLEAN, CORRUPT, first_logits)
    assert table.values.shape == (2, T) and table.axes == ("layer", "position")
    assert table.labels == (("0", "1"), tuple(map(str, range(T))))
    expected = np.zeros((2, T))
    expected[:, 0] = 1.0
    np.testing.assert_allclose(table.values, expected, atol=1e-5)
    np.testing.assert_allclose(table.raw[:, 1:], table.corrupted, atol=1e-6)
    assert not np.isclose(table.clean, table.corrupted, atol=1e-3)


def test_head_effects_of_a_linear_model_equal_the_direct_computation():
    """Without MLP or norms, one layer's output is linear in each head's z: patching head h
    moves the metric by the readout of its result's change, and the effects add up to
    patching every head at once."""
    model = ann.build(LINEAR, nnx.Rngs(0))
    table = ai.patch_heads(model, CLEAN, CORRUPT, last_logits)
    assert table.values.shape == (1, 4) and table.axes == ("layer", "head")
    names = "*.attention.result"
    results = [
        ann.run_with_cache(model, b, names=names)[1]["attention.result", 0]
        for b in (CLEAN, CORRUPT)
    ]
    change = (results[0] - results[1]) @ model.readout.kernel[...]  # [B, T, N, C]
    direct = jax.vmap(lambda c: last_logits(c, None), in_axes=2)(change)
    np.testing.assert_allclose(table.raw[0] - table.corrupted, direct, atol=1e-5)
    z = ann.run_with_cache(model, CLEAN, names="*.z")[1]["attention.z", 0]
    every = ann.run_with_hooks(model, CORRUPT, {"*.z": lambda v, c: z})
    effect = last_logits(every, CLEAN) - table.corrupted
    np.testing.assert_allclose((table.raw - table.corrupted).sum(), effect, atol=1e-5)
    assert np.ptp(np.asarray(table.values)) > 0.05  # the heads differ


def test_patterns_of_a_tiled_model_patch_on_the_dense_path_when_asked():
    table = ai.patch_heads(_model(), CLEAN, CORRUPT, last_logits, point="attention.pattern")
    with pytest.raises(ValueError, match="Pass dense=True"):
        ai.patch_heads(_model("chunked"), CLEAN, CORRUPT, last_logits, point="attention.pattern")
    tiled = ai.patch_heads(
        _model("chunked"), CLEAN, CORRUPT, last_logits, point="attention.pattern", dense=True
    )
    np.testing.assert_allclose(tiled.raw, table.raw, atol=1e-5)
    assert np.ptp(np.asarray(table.values)) > 0.05


def test_bad_batches_and_points_are_refused():
    with pytest.raises(ValueError, match="corrupted: expected the clean batch's shapes"):
        ai.patch_heads(_model(), CLEAN, {"inputs": CLEAN["inputs"][:, :3]}, last_logits)
    with pytest.raises(ValueError, match="'resid_pre' has no head axis"):
        ai.patch_heads(_model(), CLEAN, CORRUPT, last_logits, point="resid_pre")
    layer = _model().encoder.blocks[0].attention  # its points are in no list of layers
    x = jnp.zeros((B, T, 16))
    with pytest.raises(ValueError, match="'z' names no point in a list of layers"):
        ai.patch_heads(layer, x, x, lambda out, batch: out.sum(), point="z")


@pytest.mark.parametrize("norms", [False, True])
def test_logit_attribution_sums_to_the_logits(norms):
    """Heads, direct path, MLPs and biases sum to the logits (with the final norm: through
    its linearization at the run's own scale); without norms or MLPs, zero-ablating a head of
    the last layer moves the logits by exactly its attribution."""
    model = _model() if norms else _model(norms=False, mlp=False)
    parts = ai.logit_attribution(model, CLEAN)
    assert parts.heads.shape == (2, B, T, 4, 3)
    np.testing.assert_allclose(parts.total(), model(CLEAN), atol=1e-5)
    if not norms:
        z1 = "encoder.blocks.1.attention.z"
        ablated = ann.run_with_hooks(model, CLEAN, {z1: lambda z, c: z.at[..., 2, :].set(0.0)})
        np.testing.assert_allclose(model(CLEAN) - ablated, parts.heads[1, :, :, 2], atol=1e-5)


def induction_batch():
    """Repeated random tokens (period P = 4) and three hand-built patterns on them."""
    tokens = ai.repeated_tokens(jax.random.key(0), 2, 4, 8)
    length, t = tokens.shape[1], jnp.arange(tokens.shape[1])

    def attend(offset):  # query t attends to t - offset (to itself where that is < 0)
        keys = jnp.where(t - offset >= 0, t - offset, t)
        return jnp.broadcast_to(jax.nn.one_hot(keys, length), (2, 1, length, length))

    return tokens, jnp.concatenate([attend(1), attend(4), attend(3)], axis=1)  # [B, 3, T, T]


def test_detectors_on_hand_built_patterns():
    """Head 0 attends to the previous token, head 1 to the earlier copy of its token, head 2
    to the token after that copy: each scores 1 on its own detector."""
    tokens, patterns = induction_batch()
    assert tokens.shape == (2, 8) and np.all(tokens[:, :4] == tokens[:, 4:])
    assert all(len(set(row[:4].tolist())) == 4 for row in np.asarray(tokens))
    prev = ai.previous_token_scores(patterns)
    dup = ai.duplicate_token_scores(patterns, tokens)
    ind = ai.induction_scores(patterns, tokens)
    np.testing.assert_allclose(prev, [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(dup, [0.0, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(ind, [0.0, 0.0, 1.0], atol=1e-6)
    stacked = ai.induction_scores(jnp.stack([patterns, patterns[:, ::-1]]), tokens)
    np.testing.assert_allclose(stacked, [[0, 0, 1], [1, 0, 0]], atol=1e-6)


def test_a_model_held_to_the_previous_token_scores_one():
    model = nnx.clone(_model())
    model.encoder.blocks[0].attention.mask_mod = lambda b, h, q, k, params: k == q - 1
    tokens = ai.repeated_tokens(jax.random.key(0), B, T // 2, 5)
    scores = ai.detect_heads(model, {"inputs": tokens})
    assert set(scores) == {"previous-token", "duplicate-token", "induction"}
    prev = scores["previous-token"]
    assert prev.values.shape == (2, 4) and prev.axes == ("layer", "head")
    np.testing.assert_allclose(prev.values[0], 1.0, atol=1e-6)
    assert np.all(prev.values[1] < 0.9)
    for selection in ({"rows": [1, 2]}, {"heads": [2, 3]}):  # the scores index full patterns
        with pytest.raises(ValueError, match="not taken; detect_heads scores every query"):
            ai.detect_heads(model, {"inputs": tokens}, **selection)


def test_figures_keep_every_text_on_the_canvas():
    tokens, patterns = induction_batch()
    labels = (("0", "1"), tuple(map(str, range(T))))
    values = jnp.linspace(-0.5, 1.0, 2 * T).reshape(2, T)
    name = "patched resid_pre: normalized metric"
    table = ai.PatchingTable(
        values, name, ("layer", "position"), labels, values, jnp.asarray(1.0), jnp.asarray(0.0)
    )
    detector = ai.Table(
        values[:, :3], "induction score", ("layer", "head"), (labels[0], labels[1][:3])
    )
    figures = [
        ai.table_figure(table),
        ai.table_figure(detector, title="induction heads"),
        ai.pattern_grid(jnp.stack([patterns[0], patterns[1]])),
        ai.pattern_grid(patterns[:1, :2], tokens=[str(x) for x in tokens[0].tolist()]),
    ]
    for fig in figures:
        assert_laid_out(fig)
        assert fig.get_layout_engine() is not None
    assert len(figures[0].axes) == 2  # the heatmap and its colour bar
    assert figures[0].axes[0].get_xlabel() == "position"
    assert figures[0].axes[1].get_ylabel() == "normalized metric"
