"""An experiment's record: ``report.md`` (one ``verdict <claim>: <verdict>`` line per claim
judged, then the sections), ``results.csv``, ``env.json`` and the figures the report shows; and
its publication, those files copied to ``results/<experiment>/`` (no run folders, no
checkpoints).
"""

import os
import platform
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from attnjax.experiment import storage

RECORD_FILES = ("report.md", "env.json", "results.csv", "analysis.csv")  # and its figures
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


def verdict_lines(verdicts: Mapping[str, tuple[str, str]]) -> str:
    return "".join(f"verdict {claim}: {v}\n" for claim, (v, _) in verdicts.items())


def write_report(out: Path, verdicts: Mapping[str, tuple[str, str]], bodies: Sequence[str]):
    """``report.md``: the verdict lines, then each section."""
    text = verdict_lines(verdicts) + "\n" + "\n".join(bodies)
    (out / "report.md").write_text(text)


def environment(argv: Sequence[str]) -> dict[str, Any]:
    """:func:`storage.environment` plus the CPU, its core count and the command
    (``attnjax`` + ``argv``)."""
    return storage.environment() | {
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "command": " ".join(["attnjax", *argv]),
    }


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
