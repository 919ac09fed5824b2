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
    assert stats["sharp_heads"].tolist() == [[2]] and stats["average"].tolist() == [[True]]
    assert stats["average_entropy"][0, 0] > stats["heads_entropy"][0, 0]
    w[0, 1, 0] = w[0, 0, 0]  # both sharp heads on key 0: the average stays unimodal
    assert module.row_stats(w)["average"].tolist() == [[False]]


def _head_init_rows(
    beta,
    norm=(1.0, 0.98, 1.02),
    check=(1.0, 0.995, 1.005),
    independence=(1.0, 0.97, 1.03),
    excess=0.04,
):
    """Constructed rows of head_init's record: scaled and unscaled dot at h = 1, 2, 4 with the
    intervals ``beta`` (the pooled exponent of ρ_h and every local one), and at h ≥ 2 ``norm``
    (norm ratio), ``check`` (cross-term ratio) and ``independence`` (measured ÷ independent
    heads' CV²); ``excess``: e_1 (e_h = excess / h; at or below 0: undefined exponents)."""
    rows = []
    for score in ("scaled_dot", "dot"):
        for h in (1, 2, 4):
            one = h == 1
            b, n, c, i = (
                (None,) * 3 if one else beta,
                (1.0,) * 3 if one else norm,
                (1.0,) * 3 if one else check,
                (1.0,) * 3 if one else independence,
            )
            defined = excess > 0
            rows.append({"score": score, "heads": h, "inputs": 8, "output_mean_square": 0.14,
                         "norm_ratio": n[0], "norm_ratio_low": n[1], "norm_ratio_high": n[2],
                         "norm_variance": 1e-3 / h, "rho": 1 / h, "rho_low": 0.9 / h,
                         "rho_high": 1.1 / h, "local_exponent": b[0],
                         "local_exponent_low": b[1], "local_exponent_high": b[2],
                         "exponent": beta[0], "exponent_low": beta[1],
                         "exponent_high": beta[2], "norm_cv2": 0.05 / h, "input_cv2": 0.06 / h,
                         "gaussian_floor": 0.007, "kappa": 0.05, "independent_cv2": 0.05 / h,
                         "independence_ratio": i[0], "independence_ratio_low": i[1],
                         "independence_ratio_high": i[2], "norm_excess": excess / h,
                         "excess_exponent": (1.0 if defined else None) if not one else None,
                         "excess_exponent_low": (0.9 if defined else None) if not one else None,
                         "excess_exponent_high": (1.1 if defined else None) if not one else None,
                         "excess_slope": 1.0 if defined else None,
                         "excess_slope_low": 0.9 if defined else None,
                         "excess_slope_high": 1.1 if defined else None,
                         "excess_undefined": 0.0 if defined else 1.0,
                         "cross_ratio": c[0], "cross_ratio_low": c[1],
                         "cross_ratio_high": c[2]})  # fmt: skip
    return rows


def test_head_init_rule_comes_out_every_way_and_reports_its_checks_apart():
    from attnjax.experiment import load_file
    from tests.experiment.conftest import EXPERIMENTS

    module = load_file(EXPERIMENTS / "head_init.py")

    def judge(*args, **kwargs):
        analysis = module.report_from_rows({"results.csv": _head_init_rows(*args, **kwargs)})
        return analysis.verdicts["M3"][0], analysis.body

    assert judge((1.0, 0.9, 1.1))[0] == "supported"  # Var(s | x) falls as 1/h
    assert judge((0.16, 0.11, 0.2))[0] == "refuted"  # barely averages (the referee's reading)
    assert judge((0.1, -0.1, 0.3))[0] == "refuted"  # no averaging: β ≈ 0
    assert judge((1.9, 1.6, 2.2))[0] == "refuted"  # far faster than 1/h
    assert judge((0.8, 0.4, 1.2))[0] == "inconclusive"  # too wide to tell
    assert judge((0.6, 0.55, 0.7))[0] == "inconclusive"  # precisely partial averaging
    assert judge((1.0, 0.9, 1.1), norm=(0.7, 0.65, 0.75))[0] == "refuted"  # part 1 fails
    assert judge((1.0, 0.9, 1.1), norm=(1.0, 0.85, 1.15))[0] == "inconclusive"
    assert judge((1.0, None, None))[0] == "inconclusive"  # an undefined interval: never judged
    verdict, body = judge((1.0, 0.9, 1.1), check=(1.03, 1.025, 1.035))  # 3% cross terms ...
    assert verdict == "supported" and "(cross terms vanish in expectation): FAIL" in body
    verdict, body = judge((1.0, 0.9, 1.1), independence=(1.3, 1.2, 1.4))  # dependent heads
    assert verdict == "supported" and "within [0.9, 1.1]: FAIL" in body
    body = judge((1.0, 0.9, 1.1))[1]
    assert "(cross terms vanish in expectation): pass" in body
    assert "within [0.9, 1.1]: pass" in body
    flagged = judge((1.0, 0.9, 1.1), excess=-0.001)  # an excess ≤ 0: flagged, not clipped
    assert flagged[0] == "supported" and "≤ 0: flagged" in flagged[1]
    assert "undefined (an excess ≤ 0)" in flagged[1]


def test_head_init_estimators_on_synthetic_heads():
    import numpy as np

    from attnjax.experiment import load_file
    from tests.experiment.conftest import EXPERIMENTS

    module = load_file(EXPERIMENTS / "head_init.py")
    rng = np.random.default_rng(0)
    n, size, h = 1500, 40, 4
    ones = np.ones((1, n))
    z = rng.normal(size=(n, size))
    _, floor, excess = (float(v.mean()) for v in module.norm_excess(z, ones))
    assert abs(floor - 2 / size) < 0.01 and abs(excess) < 0.01  # Gaussian: only the floor
    gains = rng.uniform(0.3, 1.7, size=(n, h, 1))  # one head's norm: a random gain
    heads = gains * rng.normal(size=(n, h, size)) / np.sqrt(h)  # fixed total width
    e1, independent, shared = (
        float(module.norm_excess(o, ones, groups=3)[2].mean())  # three inputs' groups: same law
        for o in (heads[:, 0] * np.sqrt(h), heads.sum(1), (gains[:, :1] * heads / gains).sum(1))
    )
    assert 0.75 < module._exponent(e1, independent, h) < 1.25  # independent heads: e_1 / h
    assert abs(module._exponent(e1, shared, h)) < 0.25  # one gain for all heads: no averaging
    assert np.isnan(module._exponent(e1, -1e-4, h))  # an excess ≤ 0: undefined, not clipped
    # the independent heads' CV² F + (κ − F)/h equals the measured one (an identity)
    s_each = np.sum(heads**2, axis=-1)
    kappa = np.mean(s_each.var(0, ddof=1) / s_each.mean(0) ** 2)
    cv2, floor, _ = (float(v.mean()) for v in module.norm_excess(heads.sum(1), ones))
    assert abs(cv2 / (floor + (kappa - floor) / h) - 1) < 0.1
    halving = np.array([[0.04, 0.02, 0.01, 0.005], [0.04, 0.04, 0.04, 0.04]])
    assert np.allclose(module._pooled((1, 2, 4, 8), halving), [1.0, 0.0])  # ∝ 1/h; flat
    assert np.isnan(module._pooled((1, 2), np.array([[0.04, 0.0]])))[0]  # ≤ 0: undefined
    assert module._percentile(np.array([0.9, np.nan]))[:2] == (None, None)
