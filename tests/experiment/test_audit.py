"""The audit of verdict rules on constructed experiments (a rule that can only support, a
knife-edge record, an edge learning rate, decisive margins, checks, can parts and their
witnesses) and on committed records (through the CLI; the fragile one's margin)."""

import dataclasses
import math
import pathlib

import numpy as np
import pytest

from attnjax import cli
from attnjax.experiment import Experiment, Summary
from attnjax.experiment.audit import audit, audit_table
from attnjax.experiment.margins import decisive, smallest
from attnjax.experiment.parts import Check, Part
from attnjax.experiment.record import read_rows
from attnjax.experiment.report import mean_ci95
from attnjax.experiment.sweep import Stats, summarize, sweep_report

ROOT = pathlib.Path(__file__).parents[2]
POINTS = ({"model.score": "dot"}, {"model.score": "additive"})


def _summary(dot, additive, rates=((1e-3, 0.5, 0.5), (3e-3, 0.6, 0.6), (1e-2, 0.5, 0.5))):
    def stats(values):
        return Stats(*mean_ci95(values), tuple(values), 3e-3, 100, rates)

    return Summary([(POINTS[0], stats(dot)), (POINTS[1], stats(additive))])


def _experiment(smoke_config, rule) -> Experiment:
    return Experiment("constructed", "X1", "a claim", smoke_config, POINTS, "accuracy", rule)


def _additive_wins(summary):
    dot, additive = summary[POINTS[0]], summary[POINTS[1]]
    if additive.lower > dot.upper:
        return "supported", ""
    return ("refuted", "") if dot.lower > additive.upper else ("inconclusive", "")


def test_a_rule_that_can_only_support_is_unrefutable(smoke_config):
    def lenient(summary):
        return ("supported", "") if summary[POINTS[1]].mean >= 0.0 else ("inconclusive", "")

    found = audit(_experiment(smoke_config, lenient), _summary([0.5] * 5, [0.9] * 5), draws=50)
    assert found.reachable == ("supported",)
    assert "unrefutable" in found.flags and "unsupportable" not in found.flags
    fair = audit(_experiment(smoke_config, _additive_wins), _summary([0.5] * 5, [0.9] * 5))
    assert fair.reachable == ("supported", "refuted", "inconclusive") and not fair.flags


def test_a_rule_supported_only_inside_a_narrow_band_is_reachable(smoke_config):
    """Supported only with both points in [0.77, 0.80] and tight: random draws miss the band,
    the tied levels do not."""

    def band(summary):
        points = [summary[p] for p in POINTS]
        if any(s.lower > 0.8 for s in points):
            return "refuted", ""
        inside = all(s.lower >= 0.77 and s.upper <= 0.8 for s in points)
        return ("supported" if inside else "inconclusive"), ""

    found = audit(_experiment(smoke_config, band), _summary([0.5] * 5, [0.9] * 5), draws=10)
    assert found.reachable == ("supported", "refuted", "inconclusive") and not found.flags


def test_a_rule_asking_one_point_at_the_top_and_another_mid_range_is_reachable(smoke_config):
    """Supported only with additive solved (lower > 0.99) and dot tight mid-range (within
    [0.4, 0.6]): uniform draws, ends and ties all miss it; points at their own levels do not."""

    def solved_and_middle(summary):
        dot, additive = summary[POINTS[0]], summary[POINTS[1]]
        if additive.upper < 0.5:
            return "refuted", ""
        middle = 0.4 <= dot.lower and dot.upper <= 0.6
        return ("supported" if additive.lower > 0.99 and middle else "inconclusive"), ""

    found = audit(_experiment(smoke_config, solved_and_middle), _summary([0.5] * 5, [0.2] * 5),
                  draws=10)  # fmt: skip
    assert found.verdict == "refuted"
    assert found.reachable == ("supported", "refuted", "inconclusive") and not found.flags


def test_a_knife_edge_record_is_fragile_and_a_clear_one_is_not(smoke_config):
    """Additive's interval clears dot's by 0.003: resampling the seeds often closes the gap."""
    rule = _experiment(smoke_config, _additive_wins)
    clear = audit(rule, _summary([0.50, 0.52, 0.49, 0.51, 0.50], [0.95, 0.97, 0.96, 0.94, 0.98]))
    assert clear.verdict == "supported" and clear.agreement == 1.0 and "fragile" not in clear.flags
    knife = audit(rule, _summary([0.50, 0.50, 0.51, 0.50, 0.50], [0.52, 0.51, 0.53, 0.52, 0.515]))
    assert knife.verdict == "supported" and knife.agreement < 0.9 and "fragile" in knife.flags


def test_points_at_an_edge_of_their_rate_grid_are_flagged(smoke_config):
    at_edge = ((1e-3, 0.5, 0.5), (3e-3, 0.6, 0.6), (1e-2, 0.7, 0.7))
    summary = _summary([0.5] * 5, [0.9] * 5, rates=at_edge)
    summary = Summary([(p, s._replace(learning_rate=1e-2)) for p, s in summary])
    found = audit(_experiment(smoke_config, _additive_wins), summary, draws=10)
    assert found.edges == ("score=dot", "score=additive") and "edge" in found.flags


def test_a_committed_record_recomputes_its_verdict_and_is_audited(capsys):
    """impostor's rule on its results.csv gives its report's verdict; the CLI prints its
    row."""
    from attnjax.experiment import load_file

    experiment = load_file(ROOT / "experiments" / "impostor.py").get_experiment()
    rows = read_rows(ROOT / "results" / "impostor" / "results.csv")
    verdict = experiment.verdict(summarize(experiment, rows)[0])[0]
    report = (ROOT / "results" / "impostor" / "report.md").read_text()
    assert f"verdict {experiment.claim_id}: {verdict}" in report
    cli.main(["audit", "impostor", "--root", str(ROOT), "--draws", "20"])
    row = [line for line in capsys.readouterr().out.splitlines() if "impostor" in line]
    assert row and f"| {verdict} |" in row[0]


def test_audit_takes_an_analysis_and_refuses_an_unknown_name_in_one_line(capsys):
    """temperature (an analysis, no seeds) is audited as deterministic; a name without an
    experiment file exits 2 with one line."""
    cli.main(["audit", "temperature", "--root", str(ROOT)])
    row = [line for line in capsys.readouterr().out.splitlines() if "| temperature |" in line]
    assert row and "| S5 |" in row[0] and "deterministic (no seed axis)" in row[0]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit", "no_such_experiment", "--root", str(ROOT)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs experiments/no_such_experiment.py and" in err


def test_margins_are_the_decisive_comparisons_in_paired_standard_errors(smoke_config):
    """Additive's lower end clears dot's upper end: that comparison decides *supported*, its
    margin is the gap over the standard error of the per-seed differences; the comparisons a
    rule makes only to word its reason (``max`` of the means) decide nothing."""

    def rule(summary):
        dot, additive = summary[POINTS[0]], summary[POINTS[1]]
        best = max(dot.mean, additive.mean)  # compared, but only for the text
        verdict = "supported" if additive.lower > dot.upper else "inconclusive"
        return verdict, f"best {best:.3f}"

    dot, additive = [0.50, 0.52, 0.49, 0.51, 0.50], [0.95, 0.97, 0.96, 0.94, 0.98]
    summary = _summary(dot, additive)
    found = audit(_experiment(smoke_config, rule), summary, draws=10)
    assert [str(c) for c in found.margins] == ["score=additive lower > score=dot upper"], (
        found.margins
    )
    a, d = summary[POINTS[1]], summary[POINTS[0]]
    gap = a.lower - d.upper
    se = np.std(np.subtract(additive, dot), ddof=1) / np.sqrt(5)
    assert found.margin.margin == pytest.approx(gap / se) and found.margin.held
    assert "SE: `score=additive lower > score=dot upper`" in audit_table({"c": found})


def test_a_bar_comparison_has_the_points_standard_error_and_ties_have_none(smoke_config):
    def rule(summary):
        return ("supported", "") if summary[POINTS[1]].mean >= 0.9 else ("refuted", "")

    found = audit(_experiment(smoke_config, rule), _summary([0.5] * 5, [0.9, 1.0] * 2 + [1.0]))
    (c,) = found.margins
    assert c.difference == pytest.approx(0.06)
    assert c.margin == pytest.approx(0.06 / (np.std([0.9, 1.0] * 2 + [1.0], ddof=1) / 5**0.5))
    exact = audit(_experiment(smoke_config, rule), _summary([0.5] * 5, [1.0] * 5), draws=5)
    assert exact.margin.margin == math.inf  # no spread over seeds
    counts = audit(_experiment(smoke_config, _by_counts), _summary([0.5] * 5, [1.0] * 5), draws=5)
    assert counts.margins == () and "no traced comparison" in audit_table({"c": counts})


def _by_counts(summary):
    """A rule on per-seed values (solved counts): no traced comparison."""
    return ("supported", "") if summary[POINTS[1]].solved(0.9) >= 3 else ("refuted", "")


def test_checks_are_reported_and_never_change_the_verdict(smoke_config):
    checks = (
        Check("weights sum to 1", lambda: True),
        Check("cap is 3/4", lambda: False, "theorem"),
        Check("raises", lambda: 1 / 0, "initialization"),
    )
    plain = _experiment(smoke_config, _additive_wins)
    checked = dataclasses.replace(plain, checks=checks)
    summary = _summary([0.5] * 5, [0.9] * 5)
    found = audit(checked, summary, draws=10)
    assert found.verdict == audit(plain, summary, draws=10).verdict == "supported"
    assert found.checks == (("weights sum to 1", True), ("cap is 3/4", False), ("raises", False))
    assert "check-failed" in found.flags and "check-failed" not in audit(plain, summary).flags
    assert "weights sum to 1: pass; cap is 3/4: FAIL" in audit_table({"c": found})
    body = sweep_report(checked, summary, "supported", "r", 5)
    assert "**Checks** (hold by construction; not evidence, not counted in the verdict)" in body
    with pytest.raises(ValueError, match="kind"):
        Check("x", lambda: True, "hunch")


def test_a_witness_supports_a_can_part_and_training_alone_may_not_refute_one(smoke_config):
    """The fair rule can give *refuted*: a *can* part resting on it alone is flagged; a
    witness reaching the bar, or an impossibility argument, lifts the flag; a *does* part and
    a rule that cannot refute are never flagged."""
    experiment = dataclasses.replace(_experiment(smoke_config, _additive_wins), solved_at=0.9)
    summary = _summary([0.5] * 5, [0.9] * 5)

    def flags(*parts):
        return audit(dataclasses.replace(experiment, parts=parts), summary, draws=5).flags

    bare = Part("additive can rank the key", "can")
    assert "can-refuted-by-training (additive can rank the key)" in flags(bare)
    witnessed = dataclasses.replace(bare, witness=lambda: 1.0)
    found = audit(dataclasses.replace(experiment, parts=(witnessed,)), summary, draws=5)
    assert not any(f.startswith("can-refuted") for f in found.flags)
    assert str(found.parts[0]) == "can: additive can rank the key (witness 1.000)"
    short = dataclasses.replace(bare, witness=lambda: 0.6)
    assert "can-refuted-by-training (additive can rank the key)" in flags(short)
    argued = dataclasses.replace(bare, impossibility="tests/test_scores.py::test_affine")
    assert not any(f.startswith("can-refuted") for f in flags(argued))
    assert not any(f.startswith("can-refuted") for f in flags(Part("training finds it", "does")))

    def never_refutes(s):
        return ("supported", "") if s[POINTS[1]].mean >= 0.9 else ("inconclusive", "")

    lenient = dataclasses.replace(bare, rule=never_refutes)
    assert not any(f.startswith("can-refuted") for f in flags(lenient))
    body = sweep_report(dataclasses.replace(experiment, parts=(witnessed,)), summary, "s", "", 5)
    assert "witness (hand-set parameters) reaches 1.000, which supports it on its own" in body
    with pytest.raises(ValueError, match="for a can part"):
        Part("x", "does", witness=lambda: 1.0)


def test_a_knife_edge_mean_has_a_margin_under_one_standard_error_the_records_over_two():
    """A mean 0.0004 over its bar (mqar's first record at width 256: 0.9904 over seeds 0-4
    against 0.99, about 60% bootstrap agreement) has a decisive margin under one standard
    error; every traced committed record's is over two."""
    from attnjax.experiment import load_file

    def solved(summary):
        return ("supported", "") if summary[POINTS[1]].mean >= 0.99 else ("refuted", "")

    first_record = [0.9912, 0.9946, 0.9910, 0.9880, 0.9871]
    fragile = smallest(decisive(solved, _summary([0.5] * 5, first_record)))
    assert fragile.margin < 1 and str(fragile).startswith("score=additive")
    margins = {}
    for name in ("impostor", "copy"):
        experiment = load_file(ROOT / "experiments" / f"{name}.py").get_experiment()
        rows = read_rows(ROOT / "results" / name / "results.csv")
        margins[name] = smallest(decisive(experiment.verdict, summarize(experiment, rows)[0]))
    assert all(margins[n].margin > 2 for n in ("impostor", "copy"))
