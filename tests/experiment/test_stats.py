"""attnjax.experiment.stats against scipy's t-tests and a simulation of power."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from attnjax.experiment import stats
from attnjax.experiment.margins import decisive
from attnjax.experiment.sweep import Stats, Summary

VALUES = (0.61, 0.72, 0.55, 0.68, 0.70)
OTHER = (0.58, 0.69, 0.50, 0.66, 0.64)


def _stats(values):
    return Stats(float(np.mean(values)), float("nan"), tuple(values), 0.01, 1)


def test_one_sided_bounds_agree_with_scipys_t_test():
    # lower(x) > bar exactly when scipy's one-sided test rejects "mean <= bar" at 5%.
    for bar in (0.5, 0.6, 0.62, 0.64, 0.7):
        p = scipy_stats.ttest_1samp(VALUES, bar, alternative="greater").pvalue
        assert (stats.lower(VALUES) > bar) == (p < 0.05)
        p = scipy_stats.ttest_1samp(VALUES, bar, alternative="less").pvalue
        assert (stats.upper(VALUES) < bar) == (p < 0.05)
    assert stats.lower(_stats(VALUES)) == pytest.approx(stats.lower(VALUES))


def test_paired_bounds_agree_with_scipys_paired_test_and_are_tighter():
    p = scipy_stats.ttest_rel(VALUES, OTHER, alternative="greater").pvalue
    assert p < 0.05 and stats.paired_lower(VALUES, OTHER) > 0
    # The two points' own intervals overlap: unpaired, the same data establish nothing.
    assert stats.lower(VALUES) < stats.upper(OTHER)
    with pytest.raises(ValueError, match="one value per shared seed"):
        stats.paired_lower(VALUES, OTHER[:4])


def test_equivalence_needs_both_one_sided_tests():
    assert stats.equivalent(VALUES, OTHER, margin=0.1)
    assert not stats.equivalent(VALUES, OTHER, margin=0.02)  # the difference is ≈ 0.038
    noisy = np.array(VALUES) + np.array([0.3, -0.3, 0.3, -0.3, 0.0])
    assert not stats.equivalent(noisy, VALUES, margin=0.1)  # too noisy to call a tie
    with pytest.raises(ValueError, match="margin"):
        stats.equivalent(VALUES, OTHER, margin=0.0)


def test_power_matches_a_simulation():
    rng = np.random.default_rng(0)
    n, effect, sd = 6, 0.5, 0.6
    draws = rng.normal(effect, sd, size=(4000, n))
    simulated = np.mean([stats.lower(d) > 0 for d in draws])
    assert stats.power(n, effect, sd) == pytest.approx(simulated, abs=0.03)
    needed = stats.seeds_needed(effect, sd)
    assert stats.power(needed, effect, sd) >= 0.8 > stats.power(needed - 1, effect, sd)
    assert stats.seeds_needed(1e-3, 1.0, most=20) is None


def test_the_audit_traces_one_sided_and_paired_comparisons():
    a, b = {"x": "a"}, {"x": "b"}
    summary = Summary([(a, _stats(VALUES)), (b, _stats(OTHER))])

    def rule(s):
        ahead = stats.paired_lower(s[a], s[b]) > 0
        return ("supported" if ahead and stats.lower(s[a]) > 0.5 else "refuted"), ""

    found = {str(c): c for c in decisive(rule, summary)}
    assert set(found) == {"x=a − x=b paired lower > 0", "x=a one-sided lower > 0.5"}
    paired = found["x=a − x=b paired lower > 0"]
    differences = np.subtract(VALUES, OTHER)
    assert paired.se == pytest.approx(differences.std(ddof=1) / np.sqrt(5))
