"""Records that check themselves: each published record's ``report.md`` recomputed from the
tables it holds, with the rules of its experiment file, never by measuring again.

A trained sweep (``get_experiment``) is summarized from ``results.csv`` as the sweep does it
(:func:`attnjax.experiment.sweep.summarize`): the table itself (each point's overrides, its
``chosen`` rate), the summary, the verdict and the report's section. An analysis (``analyze``)
is recomputed by the experiment's ``report_from_rows(tables)``, the function its ``analyze``
ends with: ``tables`` maps each CSV of the record (``analysis.csv``, ``results.csv``) to its
rows, cells parsed back to values (:func:`attnjax.experiment.record.read_rows`).
"""

import functools
from collections.abc import Sequence
from pathlib import Path

from attnjax.experiment import load_file, record, storage
from attnjax.experiment.sweep import judge, summarize, sweep_report

CSV_FILES = ("analysis.csv", "results.csv")


class NotRecomputable(Exception):
    """The experiment gives no way to recompute its report from its tables."""


def expected_report(folder: Path, experiment_file: Path) -> str:
    """The ``report.md`` that the tables in ``folder`` give under ``experiment_file``'s rules;
    a :class:`Differs` if ``results.csv`` differs from the table its own rows make or holds
    the experiment's pilot seeds."""
    if not experiment_file.is_file():
        raise NotRecomputable(f"no experiments/{experiment_file.name}")
    texts = tuple((n, (folder / n).read_text()) for n in CSV_FILES if (folder / n).is_file())
    return _expected(str(experiment_file.resolve()), experiment_file.read_text(), texts)


@functools.cache
def _expected(path: str, source: str, texts: tuple[tuple[str, str], ...]) -> str:
    """:func:`expected_report` from the tables' texts, cached by the experiment file's resolved
    path, its source and the texts (``source`` is the key's: the file is loaded from
    ``path``)."""
    module, experiment_file = load_file(path), Path(path)
    tables = {n: record.parse_rows(t) for n, t in texts}
    verdicts, bodies = {}, []
    if hasattr(module, "analyze"):
        if not hasattr(module, "report_from_rows"):
            raise NotRecomputable(f"{experiment_file.name} defines no report_from_rows(tables)")
        analysis = module.report_from_rows(tables)
        verdicts |= analysis.verdicts
        bodies.append(analysis.body)
    if hasattr(module, "get_experiment"):
        experiment = module.get_experiment()
        rows = tables["results.csv"]
        if pilot := sorted({r["seed"] for r in rows} & set(experiment.pilot_seeds)):
            raise Differs(f"results.csv: trained on the pilot seeds {pilot}")
        try:
            summary, table = summarize(experiment, rows)
        except ValueError as error:
            raise Differs(str(error)) from None
        _compare_cells(dict(texts)["results.csv"], table)
        verdict, reason = judge(experiment, summary)
        record_seeds = sorted({r["seed"] for r in rows})  # as trained (--set train.seed too)
        verdicts[experiment.claim_id] = (verdict, reason)
        bodies.append(
            sweep_report(experiment, summary, verdict, reason, len(record_seeds), record_seeds)
        )
    return record.report_text(verdicts, bodies)


class Differs(ValueError):
    """A table of the record differs from what its own rows give."""


def _compare_cells(text: str, table: list[dict]) -> None:
    committed = storage.parse_csv(text)
    for i, (row, expected) in enumerate(zip(committed, table, strict=True), start=2):
        for column, value in expected.items():
            cell = "" if value is None else str(value)
            if row.get(column) != cell:
                raise Differs(
                    f"results.csv line {i}, {column}: {row.get(column)!r}, but its rows give "
                    f"{cell!r}"
                )


def differences(root: Path, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(differences, unchecked)`` for the records ``results/<name>/`` under ``root``: each
    record whose ``report.md`` differs from what its tables give (recomputed with
    ``experiments/<name>.py``), with the first difference; and each record that cannot be
    recomputed, with why."""
    found, unchecked = [], []
    for name in names:
        folder = root / "results" / name
        if not (folder / "report.md").is_file():
            continue
        try:
            expected = expected_report(folder, root / "experiments" / f"{name}.py")
        except NotRecomputable as why:
            unchecked.append(f"results/{name}: {why}")
            continue
        except Differs as error:
            found.append(f"results/{name}: {error}")
            continue
        committed = (folder / "report.md").read_text()
        if committed != expected:
            where = _first(committed, expected)
            found.append(f"results/{name}/report.md differs from its tables: {where}")
    return found, unchecked


def _first(committed: str, expected: str, context: int = 40) -> str:
    """Where the first difference is: its line, and that line around it as the report has it
    and as the tables give it."""
    a, b = committed.splitlines(), expected.splitlines()
    line = next((i for i, pair in enumerate(zip(a, b, strict=False)) if pair[0] != pair[1]),
                min(len(a), len(b)))  # fmt: skip
    have, want = (lines[line] if line < len(lines) else "(end)" for lines in (a, b))
    col = next((i for i, pair in enumerate(zip(have, want, strict=False)) if pair[0] != pair[1]),
               min(len(have), len(want)))  # fmt: skip
    start = max(col - context, 0)
    return (
        f"line {line + 1}: the report has {have[start : col + context]!r}, its tables give "
        f"{want[start : col + context]!r}"
    )
