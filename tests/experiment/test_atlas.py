"""The expressiveness atlas: matched widths, the rules of its claims on known cells, the smoke
atlas through the command line (its record recomputes from its table, a second call reads the
finished columns' tables, a table of another plan is refused), and its refusals."""

import math
import pathlib

import pytest

from attnjax import cli
from attnjax.experiment import atlas, load_file, record, with_overrides
from attnjax.experiment.sweep import Stats
from attnjax.experiment.trainer import Trainer

ROOT = pathlib.Path(__file__).parents[2]
ATLAS = load_file(ROOT / "experiments" / "atlas.py")


def test_matched_width_is_the_largest_within_the_scaled_dot_budget():
    base = ATLAS.columns(smoke=True)[1].base  # xor_relation, width 32
    budget = atlas.param_count(with_overrides(base, {"model.score": "scaled_dot"}))
    assert budget == Trainer(base).param_count()
    for score in ATLAS.SCORES:
        width = atlas.matched_width(base, score, 1, 1)
        params = {w: atlas.param_count(with_overrides(base, {"model.score": score,
                                                              "model.width": w}))
                  for w in (width, width + atlas.WIDTH_STEP)}  # fmt: skip
        assert params[width] <= budget * (1 + atlas.TOLERANCE)
        assert width == base.model.width or params[width + 4] > budget * (1 + atlas.TOLERANCE)
    assert atlas.matched_width(base, "dot", 1, 1) == 32  # no extra parameters
    assert atlas.matched_width(base, "additive", 1, 1) < 32  # W_q, W_k, v and b cost width


def _cells(values: dict[tuple[str, str, int, int], tuple[float, ...]]):
    return {k: atlas.Cell(Stats(sum(v) / len(v), 0.0, v, 1e-3, 0), math.nan, 0.0)
            for k, v in values.items()}  # fmt: skip


SOLVED, FAILED, HALF = (1.0,) * 5, (0.2,) * 5, (1.0, 1.0, 0.2, 0.2, 1.0)


def _one_head(additive: tuple[float, ...], dot: tuple[float, ...] = SOLVED):
    """One column at one head, both layer counts: the multiplicative scores at ``dot``, the
    additive ones at ``additive``, cosine failing."""
    found = {}
    for layers in (1, 2):
        for score in ATLAS.SCORES:
            own = dot if score in ATLAS.MULTIPLICATIVE else additive
            found[("c", score, 1, layers)] = FAILED if score == "cosine" else own
    return _cells(found)


def test_a1_rule_comes_out_each_way():
    assert ATLAS.additive_solves(_one_head(SOLVED), ["c"])[0] == "supported"
    assert ATLAS.additive_solves(_one_head(FAILED), ["c"])[0] == "refuted"
    assert ATLAS.additive_solves(_one_head(HALF), ["c"])[0] == "inconclusive"
    verdict, reason = ATLAS.additive_solves(_one_head(FAILED, dot=FAILED), ["c"])
    assert verdict == "inconclusive" and "0 (column, layers) solved" in reason  # vacuous


def _pair(cosine: dict[str, tuple[float, ...]]):
    base = (0.5, 0.6, 0.7, 0.8, 0.9)
    found = {}
    for name, values in cosine.items():
        found[(name, "scaled_dot", 1, 1)] = base
        found[(name, "cosine", 1, 1)] = values
    return _cells(found)


def test_tie_rule_comes_out_each_way():
    same = (0.5, 0.6, 0.7, 0.8, 0.9)
    close = (0.51, 0.6, 0.71, 0.8, 0.9)
    assert (
        ATLAS.ties(_pair({"a": same, "b": close}), ["a", "b"], ["cosine"], [(1, 1)])[0]
        == "supported"
    )
    # One column far below: refuted by the column test even where the pooled mean is close.
    far = (0.1, 0.2, 0.3, 0.4, 0.5)
    columns = {n: same for n in "abcdefgh"} | {"z": far}
    verdict, reason = ATLAS.ties(_pair(columns), list(columns), ["cosine"], [(1, 1)])
    assert verdict == "refuted" and "z cosine H1 L1" in reason
    noisy = (0.1, 0.9, 0.9, 0.3, 1.0)  # differences within no margin at 5 seeds
    assert ATLAS.ties(_pair({"a": noisy}), ["a"], ["cosine"], [(1, 1)])[0] == "inconclusive"


def test_smoke_atlas_records_recomputes_and_resumes(tmp_path, capsys):
    out = tmp_path / "atlas"
    cli.main(["atlas", "--smoke", "--out", str(out), "--root", str(ROOT)])
    printed = capsys.readouterr().out
    assert "verdict A1: not judged (smoke)" in printed and (out / "atlas.png").is_file()
    rows = record.read_rows(out / "results.csv")
    assert {r["column"] for r in rows} == {c.name for c in ATLAS.columns(smoke=True)}
    assert {r["model.score"] for r in rows} == set(ATLAS.SMOKE_SCORES)
    recall = [r for r in rows if r["column"].startswith("in_context_recall")]
    assert all(0.0 <= r["longer_accuracy"] <= 1.0 for r in recall)
    assert all(r["train_flops"] == 20 * r["flops_per_step"] > 0 for r in rows)
    recomputed = ATLAS.report_from_rows({"results.csv": rows}, smoke=True)
    text = record.report_text(recomputed.verdicts, [recomputed.body], smoke=True)
    assert (out / "report.md").read_text() == text
    steps = []
    again = ATLAS.analyze(out, True, progress=lambda *a: steps.append(a))
    assert steps == [] and again.body == recomputed.body  # finished columns are read
    plan = out / "columns" / "xor_relation.json"
    plan.write_text(plan.read_text().replace('"steps": 20', '"steps": 40'))
    with pytest.raises(ValueError, match="xor_relation.csv: written for another plan"):
        ATLAS.analyze(out, True)


def test_atlas_refuses_unknown_names_and_a_published_subset(tmp_path, capsys):
    for argv, message in (
        (["--tasks", "nope"], "--tasks: unknown ['nope']"),
        (["--scores", "dot", "tanh"], "--scores: unknown ['tanh']"),
        (["--tasks", "copy", "--publish"], "--publish: a subset"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["atlas", "--root", str(ROOT), "--out", str(tmp_path / "a"), *argv])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
