"""The audit of verdict rules on constructed experiments (a rule that can only support, a
knife-edge record, an edge learning rate) and on a committed record through the CLI."""

import pathlib

import pytest

from attnjax import cli
from attnjax.experiment import Experiment, Summary
from attnjax.experiment.audit import audit
from attnjax.experiment.record import read_rows
from attnjax.experiment.report import mean_ci95
from attnjax.experiment.sweep import Stats, summarize

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
    """mqa_ordering's rule on its results.csv gives its report's verdict; the CLI prints its
    row."""
    from attnjax.experiment import load_file

    experiment = load_file(ROOT / "experiments" / "mqa_ordering.py").get_experiment()
    rows = read_rows(ROOT / "results" / "mqa_ordering" / "results.csv")
    verdict = experiment.verdict(summarize(experiment, rows)[0])[0]
    report = (ROOT / "results" / "mqa_ordering" / "report.md").read_text()
    assert f"verdict {experiment.claim_id}: {verdict}" in report
    cli.main(["audit", "mqa_ordering", "--root", str(ROOT), "--draws", "20"])
    row = [line for line in capsys.readouterr().out.splitlines() if "mqa_ordering" in line]
    assert row and f"| {verdict} |" in row[0]


def test_audit_refuses_an_analysis_experiment_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["audit", "activation", "--root", str(ROOT)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs experiments/activation.py and" in err or "is an analysis" in err
