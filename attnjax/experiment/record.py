"""An experiment's record: ``report.md`` (one ``verdict <claim>: <verdict>`` line per claim
judged, then the sections), ``results.csv``, ``env.json`` and the figures the report shows; its
publication, those files copied to ``results/<experiment>/`` (no run folders, no
checkpoints); and the ownership of output folders: ``written_by.json`` says which command
(``run`` or ``sweep``) of which file wrote the folder, and no other command writes there.
"""

import os
import platform
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from attnjax.experiment import report, storage
from attnjax.experiment.run import RUN_FILES

RECORD_FILES = ("report.md", "env.json", "results.csv", "analysis.csv")  # and its figures
OWNER_FILE = "written_by.json"  # {"kind": "run" | "sweep", "file": ..., "command": ...}
SMOKE = "not judged (smoke)"  # a smoke run's verdict: it checks that the code runs
MAX_RECORD_BYTES = 2_000_000  # per file: a record holds tables and figures, nothing large


class Analysis(NamedTuple):
    """What an experiment's ``analyze(out, smoke)`` returns: ``rows`` for ``csv_name``
    (``point``, ``seed`` and the measures; ``analysis.csv`` when a sweep of the experiment
    writes ``results.csv``), the report section's markdown ``body`` and ``verdicts``:
    ``{claim id: (verdict, reason)}``."""

    rows: list[dict[str, Any]]
    body: str
    verdicts: dict[str, tuple[str, str]]
    csv_name: str = "results.csv"


def analysis(
    name: str,
    claim_id: str,
    rows: list[dict[str, Any]],
    table: str,
    verdict: tuple[str, str],
    figures: Sequence[str] = (),
    csv_name: str = "results.csv",
) -> Analysis:
    """An :class:`Analysis` judging one claim, its body the ``table`` (markdown), the
    ``figures`` (file names in the run folder) and the verdict."""
    images = "".join(f"![{Path(f).stem}]({f})\n\n" for f in figures)
    body = (
        f"# {name} ({claim_id}): analysis\n\n{table.rstrip()}\n\n{images}"
        f"**Verdict ({claim_id}): {verdict[0]}.** {verdict[1]}\n"
    )
    return Analysis(rows, body, {claim_id: verdict}, csv_name)


def verdict_lines(verdicts: Mapping[str, tuple[str, str]], smoke: bool = False) -> str:
    """``verdict <claim>: <verdict>`` per claim; ``smoke``: ``not judged (smoke)``."""
    return "".join(f"verdict {c}: {SMOKE if smoke else v}\n" for c, (v, _) in verdicts.items())


def report_text(
    verdicts: Mapping[str, tuple[str, str]], bodies: Sequence[str], smoke: bool = False
) -> str:
    """``report.md``'s text: the verdict lines, then each section. A ``smoke`` report judges
    no claim: its verdict lines say so, and a note and every section's title say smoke."""
    text = "\n".join(bodies)
    if smoke:
        text = report.SMOKE_NOTE + re.sub(
            r"^# (.+)$", lambda m: f"# {report.smoke_title(m[1], True)}", text, flags=re.M
        )
    return verdict_lines(verdicts, smoke) + "\n" + text


def write_report(
    out: Path,
    verdicts: Mapping[str, tuple[str, str]],
    bodies: Sequence[str],
    smoke: bool = False,
) -> None:
    """``report.md`` (:func:`report_text`)."""
    (out / "report.md").write_text(report_text(verdicts, bodies, smoke))


def parse_cell(text: str) -> Any:
    """A CSV cell as the value that was written: ``""`` → None, ``True``/``False``, an int, a
    float (``str(float)`` round-trips exactly), else the text."""
    if text in ("", "True", "False"):
        return {"": None, "True": True, "False": False}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A record's CSV, each cell parsed back to its value (:func:`parse_cell`)."""
    return [{k: parse_cell(v) for k, v in r.items()} for r in storage.read_csv(path)]


def parse_rows(text: str) -> list[dict[str, Any]]:
    """:func:`read_rows` of a CSV's text."""
    return [{k: parse_cell(v) for k, v in r.items()} for r in storage.parse_csv(text)]


def check_folder(out: Path, kind: str, source: str | Path, overwrite: bool) -> None:
    """``FileExistsError`` unless ``out`` may take the record of ``attnjax <kind> <source>``:
    it is new, holds no record, or its ``written_by.json`` names the same command and file
    (which resumes); ``overwrite`` takes any folder (the command then removes its own files,
    never others)."""
    path = Path(out) / OWNER_FILE
    if overwrite:
        return
    if path.exists():
        owner = storage.read_json(path)
        if (owner["kind"], owner["file"]) == (kind, str(Path(source).resolve())):
            return
        held = f"the record of `{owner['command']}`"
    else:
        record = dict.fromkeys((*RUN_FILES, *RECORD_FILES, "points"))
        names = [n for n in record if (Path(out) / n).exists()]
        names += sorted(p.name for p in Path(out).glob("*.png") if p.name not in record)
        if not names:
            return
        held = f"a record ({', '.join(names)}) that no `attnjax {kind} {source}` wrote"
    raise FileExistsError(
        f"--out: {out} holds {held}; choose another --out, or pass --overwrite to replace "
        f"this {kind}'s own files there"
    )


def mark_folder(out: Path, kind: str, source: str | Path, argv: Sequence[str]) -> None:
    """Create ``out`` and write its ``written_by.json``: ``attnjax <kind> <source>`` owns it."""
    Path(out).mkdir(parents=True, exist_ok=True)
    owner = {"kind": kind, "file": str(Path(source).resolve()), "command": _command(argv)}
    storage.write_json(Path(out) / OWNER_FILE, owner)


def environment(argv: Sequence[str]) -> dict[str, Any]:
    """:func:`storage.environment` plus the CPU, its core count and the command
    (``attnjax`` + ``argv``)."""
    return storage.environment() | {
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "command": _command(argv),
    }


def _command(argv: Sequence[str]) -> str:
    return " ".join(["attnjax", *argv])


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def publish(out: Path, dest: Path) -> list[Path]:
    """Copy the record from ``out`` to ``dest``, replacing what ``dest`` held: ``report.md``,
    ``env.json``, ``results.csv`` (and ``analysis.csv``) and the figures ``report.md`` shows.
    Return the copied paths."""
    linked = re.findall(r"\]\(([\w.-]+\.png)\)", (out / "report.md").read_text())
    names = dict.fromkeys([*RECORD_FILES, *linked])
    files = [out / n for n in names if (out / n).is_file()]
    big = [f"{p.name} ({p.stat().st_size} bytes)" for p in files
           if p.stat().st_size > MAX_RECORD_BYTES]  # fmt: skip
    if big:
        raise ValueError(f"publish: files over {MAX_RECORD_BYTES} bytes: {', '.join(big)}")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return [Path(shutil.copy2(p, dest / p.name)) for p in files]
