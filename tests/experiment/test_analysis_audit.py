"""The audit of analyses on constructed tables: a rule that can only support is unrefutable, a
knife-edge record is fragile under the seed bootstrap, key columns never change, a table
without seeds is deterministic, and a rule that raises is counted."""

import types

import numpy as np
import pytest

from attnjax.experiment import record
from attnjax.experiment.analysis_audit import key_columns
from attnjax.experiment.audit import analysis_audits, audit_table


def _module(rule, **declared) -> types.SimpleNamespace:
    """An experiment file whose ``report_from_rows`` judges claim X1 with ``rule(rows)``."""

    def report_from_rows(tables):
        return record.Analysis([], "", {"X1": (rule(tables["results.csv"]), "")})

    return types.SimpleNamespace(report_from_rows=report_from_rows, AUDIT_DRAWS=60, **declared)


def _seeded(gap: float, spread: float) -> dict:
    """Points a and b over seeds 0-4: b above a by ``gap`` on average, per-seed noise (not
    shared: the difference varies by seed)."""
    noise = np.array([0.0, 1.0, -1.0, 0.5, -0.5]) * spread
    points = (("a", 0.5, 1), ("b", 0.5 + gap, -1))
    rows = [{"point": p, "seed": s, "value": base + sign * noise[s]}
            for p, base, sign in points for s in range(5)]  # fmt: skip
    return {"results.csv": rows}


def _b_above_a(rows) -> str:
    a = np.mean([r["value"] for r in rows if r["point"] == "a"])
    b = np.mean([r["value"] for r in rows if r["point"] == "b"])
    return "supported" if b - a > 0.1 else "refuted" if b - a < 0.0 else "inconclusive"


def test_a_rule_that_can_only_support_is_unrefutable():
    (lenient,) = analysis_audits(_module(lambda rows: "supported"), _seeded(0.3, 0.01))
    assert lenient.reachable == ("supported",) and "unrefutable" in lenient.flags
    (fair,) = analysis_audits(_module(_b_above_a), _seeded(0.3, 0.01))
    assert fair.reachable == ("supported", "refuted", "inconclusive") and not fair.flags


def test_a_knife_edge_record_is_fragile_under_the_seed_bootstrap():
    (clear,) = analysis_audits(_module(_b_above_a), _seeded(0.3, 0.01))
    assert clear.verdict == "supported" and clear.agreement == 1.0
    (knife,) = analysis_audits(_module(_b_above_a), _seeded(0.101, 0.05))
    assert knife.verdict == "supported" and knife.agreement < 0.9 and "fragile" in knife.flags


def test_key_columns_never_change():
    """tau (named in the point), the seed, an integer size, a grid axis and a declared key stay;
    the measurement moves."""
    rows = [{"point": f"tau={t}", "seed": s, "tau": t, "heads": 4, "step": k, "rate": 0.1,
             "value": t * s + k}
            for t in (0.5, 2.0) for s in range(3) for k in (0.0, 0.5)]  # fmt: skip
    keys = ("point", "seed", "tau", "heads", "step", "rate")
    assert key_columns(rows, keys=("rate",)) == set(keys)
    seen = []

    def rule(rows):
        seen.append([(tuple(r[k] for k in keys), r["value"]) for r in rows])
        return "supported" if rows[-1]["value"] > 1 else "refuted"

    analysis_audits(_module(rule, AUDIT_KEYS=("rate",)), {"results.csv": rows})
    committed = [tuple(r[k] for k in keys) for r in rows]
    assert len(seen) > 100 and all([k for k, _ in table] == committed for table in seen)
    assert len({tuple(v for _, v in table) for table in seen}) > 50


def test_tables_without_seeds_get_no_agreement_and_raising_is_counted():
    rows = [{"point": f"H={h}", "seed": 0, "H": h, "variance": float(h)} for h in (4, 16, 64)]

    def rule(rows):
        if any(r["variance"] < 0 for r in rows):
            raise ValueError("variance < 0")
        return "supported" if rows[-1]["variance"] > 2 * rows[0]["variance"] else "refuted"

    (found,) = analysis_audits(_module(rule), {"results.csv": rows})
    assert found.agreement is None and found.draws == 0 and "fragile" not in found.flags
    assert 0 < found.raised[0] < found.raised[1] == 60
    assert "deterministic (no seed axis)" in audit_table({"d": [found]})

    def always(rows):
        if [r["variance"] for r in rows] != [4.0, 16.0, 64.0]:
            raise ValueError("only the committed table")
        return "supported"

    (broken,) = analysis_audits(_module(always), {"results.csv": rows})
    assert "raises-on-every-perturbation" in broken.flags


def _paired_gap(rows) -> str:
    """Supported iff b − a, paired by seed, has a one-sided 95% lower bound above 0.05: only
    moving one point against the other reaches it."""
    by = {p: np.array([r["value"] for r in rows if r["point"] == p]) for p in "ab"}
    gap = by["b"] - by["a"]
    lower = gap.mean() - 2.132 * gap.std(ddof=1) / np.sqrt(len(gap))  # t(0.95, 4)
    return "supported" if lower > 0.05 else "refuted" if gap.mean() < 0.05 else "inconclusive"


def test_a_paired_rule_is_reached_by_an_effect_per_point():
    """The record ties a and b (refuted); moving whole columns, ties and permutations keep the
    pairing near 0, so supported needs the per-point shift."""
    (audit,) = analysis_audits(_module(_paired_gap), _seeded(0.0, 0.05))
    assert audit.verdict == "refuted" and "supported" in audit.reachable


def test_a_fast_rule_must_give_the_reports_verdicts():
    module = _module(_b_above_a, __name__="constructed")
    module.verdicts_from_rows = lambda tables: {"X1": ("refuted", "")}
    with pytest.raises(ValueError, match="verdicts_from_rows"):
        analysis_audits(module, _seeded(0.3, 0.01))
    module.verdicts_from_rows = lambda tables: {"X1": (_b_above_a(tables["results.csv"]), "")}
    (audit,) = analysis_audits(module, _seeded(0.3, 0.01))
    assert audit.verdict == "supported" and "refuted" in audit.reachable
