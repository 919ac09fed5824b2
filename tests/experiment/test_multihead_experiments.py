"""The multi-head and positional experiments' smoke variants, end to end through
``attnjax sweep``: each writes its record (verdict lines, results, environment, figures)."""

import pytest

from tests.experiment.conftest import smoke_verdicts

RECORDS = {  # claims judged, figures
    "head_init": (["M3"], ["summary.png"]),
    "head_averaging": (["M4"], ["summary.png"]),
    "head_diversity": (["M1"], ["head_diversity.png", "summary.png"]),
    "head_pruning": (["M2"], ["summary.png"]),
    "positional_amplitude": (["S7"], ["positional_amplitude.png", "summary.png"]),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_smoke_end_to_end(name, run_smoke):
    claims, figures = RECORDS[name]
    assert smoke_verdicts(run_smoke, name, figures) == (claims, claims)


def test_head_contributions_sum_to_the_layer_output():
    import jax
    from flax import nnx

    from attnjax import nn
    from attnjax.experiment import load_file
    from tests.experiment.conftest import EXPERIMENTS

    module = load_file(EXPERIMENTS / "head_init.py")
    key = jax.random.key(3)
    parts = module.head_contributions(key, 4, "scaled_dot")
    layer = nn.MultiHeadAttention(4, module.WIDTH, kernel_init=module.XAVIER, rngs=nnx.Rngs(key))
    x = jax.random.normal(jax.random.fold_in(key, 1), (1, module.TOKENS, module.WIDTH))
    assert parts.shape == (4, module.TOKENS, module.WIDTH)
    assert jax.numpy.allclose(parts.sum(0), layer(x)[0], atol=1e-5)
    assert module._judge([(1.0, 0.95, 1.05)]) == "supported"
    assert module._judge([(1.0, 0.95, 1.05), (0.7, 0.6, 0.75)]) == "refuted"
    assert module._judge([(1.0, 0.85, 1.15)]) == "inconclusive"


def test_sharp_heads_on_different_keys_average_into_two_modes():
    import numpy as np

    from attnjax.experiment import load_file
    from tests.experiment.conftest import EXPERIMENTS

    module = load_file(EXPERIMENTS / "head_averaging.py")
    w = np.full((1, 3, 1, 4), 0.05)  # heads 0, 1 sharp on keys 0 and 2; head 2 uniform
    w[0, 0, 0, 0] = w[0, 1, 0, 2] = 0.85
    w[0, 2, 0] = 0.25
    stats = module.row_stats(w)
    assert stats["sharp_heads"].tolist() == [[2]] and stats["multimodal"].tolist() == [[True]]
    assert stats["average_entropy"][0, 0] > stats["heads_entropy"][0, 0]
    w[0, 1, 0] = w[0, 0, 0]  # both sharp heads on key 0: the average stays unimodal
    assert module.row_stats(w)["multimodal"].tolist() == [[False]]
