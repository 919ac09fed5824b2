"""The expressiveness atlas: matched widths, the rules of its claims on known cells, the smoke
atlas through the command line (its record recomputes from its table, a second call reads the
finished columns' tables, a column's part table grows by the cells it lacks, a table of another
plan is refused), and its refusals."""

import json
import math
import pathlib

import jax.numpy as jnp
import pytest
from flax import nnx

from attnjax import cli, nn
from attnjax.experiment import atlas, load_file, record, storage, with_overrides
from attnjax.experiment.sweep import Stats, labels
from attnjax.experiment.trainer import Trainer
from attnjax.tasks import recall as recall_task

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
    mad = ATLAS.columns()[5]  # in_context_recall-easy: width 32, steps of 2
    points = atlas.column_experiment(mad, ["bilinear"], (1,), (1,), ATLAS.RATES).points
    widths = {p["model.width"] for p in points}
    assert (mad.width_step, widths) == (2, {30})


def test_param_count_is_counted_anew_for_a_kind_registered_anew(monkeypatch):
    """Counts are kept per model and the class registered for its kind: never stale."""
    base = ATLAS.columns(smoke=True)[1].base
    before = atlas.param_count(base)

    class WithOneMore(nn.MODELS[base.model.kind]):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.extra = nnx.Param(jnp.zeros(()))

    monkeypatch.setitem(nn.MODELS, base.model.kind, WithOneMore)
    assert atlas.param_count(base) == before + 1


COLUMNS = ATLAS.columns()  # the full atlas's 19 columns (configs only, nothing is built)
BY_NAME = {c.name: c for c in COLUMNS}
SOLVED, FAILED, HALF = (1.0,) * 5, (0.2,) * 5, (1.0, 1.0, 0.2, 0.2, 1.0)
SPREAD = (0.5, 0.6, 0.7, 0.8, 0.9)  # informative: above chance, below the bar


def _cell(values: tuple[float, ...], width: int = 32) -> atlas.Cell:
    return atlas.Cell(Stats(sum(values) / len(values), 0.0, values, 1e-3, 0), math.nan, 0.0, width)


def _atlas(changes=(), values: tuple[float, ...] = SOLVED) -> dict:
    """A complete synthetic atlas, every cell at ``values`` but those of ``changes``
    (``(column, score, heads, layers) -> values``)."""
    found = {(c.name, s, h, n): _cell(values)
             for c in COLUMNS for s in ATLAS.SCORES for h, n in ATLAS.SETTINGS}  # fmt: skip
    return found | {k: _cell(v) for k, v in dict(changes).items()}


def _one_head(additive: tuple[float, ...], dot: tuple[float, ...] = SOLVED, name="copy"):
    """``name`` at one head, both layer counts: the multiplicative scores at ``dot``, the
    additive ones at ``additive``."""
    return {(name, s, 1, n): dot if s in ATLAS.MULTIPLICATIVE else additive
            for s in ATLAS.SCORES if s != "cosine" for n in (1, 2)}  # fmt: skip


def _control(values: tuple[float, ...], name="copy") -> dict:
    """The full-width control cells of ``name``'s failed cells (both layer counts)."""
    return {(f"{name}@full_width", s, 1, n): _cell(values, width=64)
            for s in ATLAS.ADDITIVE for n in (1, 2)}  # fmt: skip


def test_a1_rule_comes_out_each_way():
    cols = [BY_NAME["copy"]]
    for additive, dot, verdict in (
        (SOLVED, SOLVED, "supported"),
        (FAILED, SOLVED, "inconclusive"),  # failed at the matched width, control not trained
        (HALF, SOLVED, "inconclusive"),
        # Both additive scores below the bar at every seed, but within 0.10 of the solving
        # score: not a failure.
        ((0.87, 0.88, 0.89, 0.88, 0.87), (0.91, 0.92, 0.93, 0.92, 0.91), "inconclusive"),
    ):
        found = _atlas(_one_head(additive, dot))
        assert ATLAS.additive_solves(found, cols)[0] == verdict, (additive, dot)
    # A failure at the matched width is a failure only if the full-width control fails too.
    found = _atlas(_one_head(FAILED))
    assert ATLAS.additive_solves(found | _control(FAILED), cols)[0] == "refuted"
    assert ATLAS.additive_solves(found | _control(HALF), cols)[0] == "inconclusive"
    found = _atlas(_one_head(FAILED, dot=FAILED))
    verdict, reason = ATLAS.additive_solves(found, cols)
    assert verdict == "inconclusive" and "0 (column, layers) solved" in reason  # vacuous


def test_a1_reason_gives_widths_and_the_full_width_control():
    found = _atlas(_one_head(FAILED)) | {("copy", "additive", 1, 1): _cell(FAILED, width=60)}
    verdict, reason = ATLAS.additive_solves(found, [BY_NAME["copy"]])
    assert verdict == "inconclusive" and "additive fails 0 (none)" in reason
    assert (
        "copy L1 (width additive 60, additive_relu 32 vs dot 32; full-width control not" in reason
    )
    verdict, reason = ATLAS.additive_solves(found | _control(HALF), [BY_NAME["copy"]])
    assert verdict == "inconclusive" and "additive fails 0 (none)" in reason
    assert "at full width 64: additive 3/5, additive_relu 3/5 solved" in reason
    verdict, reason = ATLAS.additive_solves(found | _control(FAILED), [BY_NAME["copy"]])
    assert verdict == "refuted" and "additive fails 2 (copy L1 (width additive 60" in reason


def _ties(cosine: dict[str, tuple[float, ...]], scaled_dot=SPREAD, extra=()):
    """A3's rule at one setting over the columns of ``cosine`` (name -> its values)."""
    found = {}
    for name, values in cosine.items():
        found[(name, "scaled_dot", 1, 1)] = _cell(scaled_dot)
        found[(name, "cosine", 1, 1)] = _cell(values)
    found |= {k: _cell(v) for k, v in dict(extra).items()}
    return ATLAS.ties(found, [BY_NAME[n] for n in cosine], ["cosine"], [(1, 1)])


def test_tie_rule_comes_out_each_way_and_a_flag_needs_its_fresh_seeds():
    close = (0.51, 0.6, 0.71, 0.8, 0.9)
    assert _ties({"copy": SPREAD, "mqar": close})[0] == "supported"
    noisy = (0.1, 0.9, 0.9, 0.3, 1.0)  # differences within no margin at 5 seeds
    assert _ties({"copy": noisy})[0] == "inconclusive"
    # One column far below: the screen flags it; only its fresh seeds can refute.
    far = (0.1, 0.2, 0.3, 0.4, 0.5)
    cosine = {n: SPREAD for n in ATLAS.EXPRESSIVENESS if n != "copy"} | {"copy": far}
    verdict, reason = _ties(cosine)
    assert verdict == "inconclusive" and "copy cosine H1 L1 below (not retrained)" in reason
    fresh = {("copy@confirm", "scaled_dot", 1, 1): SPREAD * 2}
    verdict, reason = _ties(cosine, extra=fresh | {("copy@confirm", "cosine", 1, 1): far * 2})
    assert verdict == "refuted" and "seeds 305-314: copy cosine H1 L1 below;" in reason
    verdict, reason = _ties(cosine, extra=fresh | {("copy@confirm", "cosine", 1, 1): SPREAD * 2})
    assert verdict == "inconclusive" and "copy cosine H1 L1 below (not confirmed)" in reason


def test_tie_rule_is_not_supported_at_chance_or_by_dilution():
    recall = [c for c in COLUMNS if c.name.split("-")[0] in ATLAS.RECALL]
    found = {}
    for c in recall:
        chance = c.base.task.spec.chance_accuracy
        for score in ATLAS.SCORES:
            found[(c.name, score, 1, 2)] = _cell(tuple(chance + d for d in (0, 0.01, -0.01, 0, 0)))
    verdict, reason = ATLAS.ties(found, recall, ["dot"], [(1, 2)])
    assert verdict == "inconclusive" and "dot H1 L2: 0/0/7" in reason
    assert "at chance (floor ≥ half): dot H1 L2" in reason
    # Above chance but at the order-blind (bag-of-tokens) accuracy: recall is not learned.
    bag = [c for c in recall if c.name in ATLAS.BAG_FLOORS]
    found = {(c.name, s, 1, 2): _cell(tuple(ATLAS.floor(c) + d for d in (0, 0.01, -0.01, 0, 0)))
             for c in bag for s in ATLAS.SCORES}  # fmt: skip
    assert all(ATLAS.floor(c) > c.base.task.spec.chance_accuracy + 0.1 for c in bag)
    assert "dot H1 L2: 0/0/4" in ATLAS.ties(found, bag, ["dot"], [(1, 2)])[1]
    # 15 columns tied at the ceiling, 4 where cosine is 0.10 worse (per-seed spread 0.15): the
    # ceiling's exact ties must not pull the mean difference inside the margin.
    worse = tuple(v + d for v, d in zip(SPREAD, (-0.25, 0.05, -0.1, -0.3, 0.1), strict=True))
    found = {}
    for i, c in enumerate(COLUMNS):
        cosine, dot = (SOLVED, SOLVED) if i < 15 else (worse, SPREAD)
        found[(c.name, "cosine", 1, 1)] = _cell(cosine)
        found[(c.name, "scaled_dot", 1, 1)] = _cell(dot)
    verdict, reason = ATLAS.ties(found, COLUMNS, ["cosine"], [(1, 1)])
    assert verdict == "inconclusive" and "cosine H1 L1: 4/15/0" in reason


def test_a2_leaves_out_the_additive_scores_on_mqar():
    # mqar keeps E6's RoPE, a handicap for the additive scores only.
    recall = [c for c in COLUMNS if c.name.split("-")[0] in ATLAS.RECALL]
    for score, flagged in (("additive", False), ("bilinear", True)):
        found = {(c.name, s, 1, 2): _cell(SPREAD) for c in recall for s in ATLAS.SCORES}
        found[("mqar", score, 1, 2)] = _cell((0.1, 0.2, 0.3, 0.4, 0.5))
        assert bool(ATLAS.flags(found, recall, [score], [(1, 2)])) == flagged
        assert f"{score} H1 L2: {7 if flagged else 6}/0/0" in ATLAS.ties(
            found, recall, [score], [(1, 2)])[1]  # fmt: skip


def test_bag_of_tokens_floors_are_the_declared_values():
    for name, value in ATLAS.BAG_FLOORS.items():
        estimate = recall_task.bag_of_tokens_accuracy(BY_NAME[name].base.task, draws=2000)
        assert round(estimate.value, 3) == value, name


def test_verdicts_of_a_complete_atlas_judge_the_declared_columns():
    cols = list(COLUMNS)
    judged = ATLAS.verdicts(_atlas(), cols)
    assert {c: v for c, (v, _) in judged.items()} == dict.fromkeys(("A1", "A2", "A3"), "supported")
    assert "dot H1 L2: 0/7/0" in judged["A2"][1] and "H1 L1" not in judged["A2"][1]
    assert "cosine H2 L2: 0/18/0" in judged["A3"][1]
    # impostor's cosine (A3), the additive scores of the automaton, memorization and mqar (A1;
    # mqar's at two layers in A2 too) are reported, not judged.
    left_out = {("impostor", "cosine", h, n): FAILED for h, n in ATLAS.SETTINGS}
    controls = {}
    for name in ("automaton-easy", "memorization-hard", "mqar"):
        left_out |= _one_head(FAILED, name=name)
        controls |= _control(FAILED, name=name)
    judged = ATLAS.verdicts(_atlas(left_out) | controls, cols)
    assert {v for v, _ in judged.values()} == {"supported"}
    # Each claim comes out refuted through its confirmed flag or failed cell, and
    # inconclusive where nothing is judged or the flag is not retrained.
    assert ATLAS.verdicts(_atlas(_one_head(FAILED)) | _control(FAILED), cols)["A1"][0] == "refuted"
    assert ATLAS.verdicts(_atlas(values=FAILED), cols)["A1"][0] == "inconclusive"
    for claim, score, column, setting in (
        ("A2", "bilinear", "noisy_recall-hard", (2, 2)),
        ("A3", "cosine", "selective_copying-easy", (1, 1)),
    ):
        found = _atlas({(column, score, *setting): FAILED})
        assert ATLAS.verdicts(found, cols)[claim][0] == "inconclusive"
        fresh = {(f"{column}@confirm", s, *setting): _cell(v * 2)
                 for s, v in ((score, FAILED), ("scaled_dot", SOLVED))}  # fmt: skip
        assert ATLAS.verdicts(found | fresh, cols)[claim][0] == "refuted"


def test_followups_and_their_cells_pair_by_seed():
    found = _atlas(_one_head(FAILED, name="copy") | {("mqar", "cosine", 2, 2): SPREAD})
    control, confirm = ATLAS.followups(found, list(COLUMNS))  # in the order of the columns
    assert (confirm.column.name, confirm.cells, confirm.seeds) == (
        "mqar@confirm", (("scaled_dot", 2, 2), ("cosine", 2, 2)), 10)  # fmt: skip
    assert confirm.column.base.train.seed == 305 and confirm.matched
    assert (control.column.name, control.cells, control.matched) == (
        "copy@full_width", (("additive", 1, 1), ("additive", 1, 2), ("additive_relu", 1, 1),
                            ("additive_relu", 1, 2)), False)  # fmt: skip
    points = control.experiment().points
    assert {p["model.width"] for p in points} == {64}  # the column's width, not matched
    # Rows in any order give each cell its values in the order of their seeds.
    rows = [{"column": "copy@full_width", "point": name, **point, "seed": seed,
             "learning_rate": 1e-3, "params": 1, "valid_accuracy": seed / 1000,
             "test_accuracy": seed / 1000, "train_flops": 1.0}
            for point, name in zip(points, labels(points), strict=True)
            for seed in (303, 300, 304, 302, 301)]  # fmt: skip
    cells = ATLAS._followup_cells([control], rows)
    assert cells[("copy@full_width", "additive", 1, 2)].stats.values == (0.3, 0.301, 0.302,
                                                                        0.303, 0.304)  # fmt: skip
    assert ATLAS._followup_cells([control._replace(seeds=10)], rows) == {}  # not its seeds


def test_only_the_declared_seed_count_is_judged():
    assert ATLAS._unjudged(_atlas(), smoke=False) is None
    three = ATLAS._unjudged(_atlas(values=(1.0,) * 3), smoke=False)
    assert three == "cells of 3 seeds judge nothing: the rules are declared for 5"
    partial = dict(list(_atlas().items())[1:])
    assert ATLAS._unjudged(partial, smoke=False).startswith("a partial atlas (455 of 456")


def test_union_of_compile_spans():
    assert atlas._union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == 4.0
    assert atlas._union([]) == 0.0


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
    assert all(0 < r["compile_s"] <= r["wall_s"] and r["cpu_s"] > 0 for r in rows)
    recomputed = ATLAS.report_from_rows({"results.csv": rows}, smoke=True)
    text = record.report_text(recomputed.verdicts, [recomputed.body], smoke=True)
    assert (out / "report.md").read_text() == text
    steps = []
    again = ATLAS.analyze(out, True, progress=lambda *a: steps.append(a))
    assert steps == [] and again.body == recomputed.body  # finished columns are read
    elsewhere = atlas.train_columns(ATLAS.experiments(True), tmp_path / "new", num_seeds=1,
                                    progress=steps.append, finished=out / "columns")  # fmt: skip
    tables = [out / "columns" / f"{c.name}.csv" for c in ATLAS.columns(smoke=True)]
    assert steps == [] and elsewhere == [r for t in tables for r in record.read_rows(t)]
    assert {r["resumed"] for r in rows} == {0} and "| the whole training |" in text
    whole_plan = tables[1].with_suffix(".json").read_text()
    part = _keep_scaled_dot(tables[1])  # xor_relation's table: the part a --scores call writes
    resumed = atlas.train_columns(ATLAS.experiments(True)[1:], out, num_seeds=1)
    grown = record.read_rows(tables[1])  # its additive cells trained again, scaled_dot's read
    assert grown[: len(part)] == part and len(grown) == 2 * len(part) and resumed == grown
    assert json.loads(tables[1].with_suffix(".json").read_text()) == json.loads(whole_plan)
    # numbered among the cells of the call, the additive cells train in folders of their own
    assert {r["resumed"] for r in grown} == {0} and grown[len(part) :] != rows[-len(part) :]
    again = ATLAS.report_from_rows({"results.csv": grown}, smoke=True).body
    assert "| the whole training, in 2 calls |" in again  # the part's call and the rest's
    subset = ATLAS.experiments(True, ["xor_relation"], ["additive"])
    elsewhere = atlas.train_columns(subset, tmp_path / "b", num_seeds=1, finished=out / "columns")
    assert elsewhere == grown[len(part) :] and not (tmp_path / "b").exists()  # read, not trained
    plan_text = tables[1].with_suffix(".json").read_text()
    plan = json.loads(plan_text)
    plan["cells"][-1]["model.width"] -= 4  # a cell asked for, at another width
    tables[1].with_suffix(".json").write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=r"xor_relation\.csv: written for another plan"):
        atlas.train_columns(subset, out, num_seeds=1)
    tables[1].with_suffix(".json").write_text(plan_text)
    plan = out / "columns" / "xor_relation.json"
    plan.write_text(plan.read_text().replace('"steps": 20', '"steps": 40'))
    with pytest.raises(ValueError, match=r"xor_relation\.csv: written for another plan"):
        ATLAS.analyze(out, True)


def _keep_scaled_dot(table: pathlib.Path) -> list[dict]:
    """Make ``table`` (a column's, with its plan) hold its scaled_dot cells only; their rows."""
    rows = [r for r in record.read_rows(table) if r["model.score"] == "scaled_dot"]
    storage.write_csv(table, rows)
    plan = json.loads(table.with_suffix(".json").read_text())
    plan["cells"] = [c for c in plan["cells"] if c["model.score"] == "scaled_dot"]
    table.with_suffix(".json").write_text(json.dumps(plan))
    return record.read_rows(table)


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


def _cells_in(folder: pathlib.Path, name: str) -> int:
    """The number of cells in the plan of ``folder``'s table of column ``name`` (0: none)."""
    plan = folder / f"{name}.json"
    return len(json.loads(plan.read_text())["cells"]) if plan.is_file() else 0


def test_the_committed_partial_atlas_is_what_its_column_tables_give(tmp_path):
    """``results/atlas/partial/report.md`` (the finished columns of an atlas still training,
    which judges nothing) recomputed from ``results/atlas/columns/*.csv``."""
    folder = ROOT / "results" / "atlas"
    if not (folder / "partial" / "report.md").is_file():
        pytest.skip("no partial atlas is committed")
    # The complete tables, in the atlas's order, as it reads them (not a column's part).
    whole = len(ATLAS.SCORES) * len(ATLAS.SETTINGS)
    names = [c.name for c in ATLAS.columns() if _cells_in(folder / "columns", c.name) == whole]
    # Read as a resumed atlas reads them: a table whose plan is no longer its column's raises.
    rows = atlas.train_columns(ATLAS.experiments(False, names), tmp_path, num_seeds=ATLAS.SEEDS,
                               finished=folder / "columns")  # fmt: skip
    assert not (tmp_path / "columns").exists()  # nothing was trained
    analysis = ATLAS.report_from_rows({"results.csv": rows})
    expected = record.report_text(analysis.verdicts, [analysis.body])
    assert (folder / "partial" / "report.md").read_text() == expected
    assert all(v == "inconclusive" for v, _ in analysis.verdicts.values())
