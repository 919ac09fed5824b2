"""An audit of a trained sweep's verdict rule, as a referee would run it: can the rule come out
either way, and does the committed verdict survive resampling its seeds?

- **Reachability**: the rule is evaluated on synthetic summaries of the experiment's points
  (every seed's value drawn across the metric's range, the extremes, each point at either end,
  ties); a rule that never gives *refuted* is ``unrefutable``, one that never gives
  *supported* ``unsupportable``.
- **Fragility**: the committed per-seed values are resampled with replacement (the same seeds
  for every point, as points share their seeds' data), ``draws`` times from a fixed key; the
  share of draws whose verdict is the committed one is the agreement, and below
  ``FRAGILE_BELOW`` the verdict is ``fragile``.
- **Edges**: points whose chosen learning rate sits at an edge of its grid.
- **Margins**: each comparison that decides the verdict (flipping it alone flips the verdict),
  with its margin in standard errors over seeds (:mod:`attnjax.experiment.margins`); the
  smallest is reported.
- **Checks**: the parts the experiment declares true by construction, run: pass or fail,
  never part of the verdict (``check-failed`` if one fails).
- **Parts**: each declared *can* part is supported by a witness, has an impossibility
  argument, or rests on training alone; a rule that can give *refuted* for a *can* part of the
  last kind is flagged ``can-refuted-by-training`` (:mod:`attnjax.experiment.parts`).

An analysis (an experiment's ``analyze``, judged by ``report_from_rows``) is audited on its
tables (:mod:`attnjax.experiment.analysis_audit`): reachability on perturbed copies of its
measurements, and fragility where its tables have a seed axis (else *deterministic*).
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnjax.experiment.analysis_audit import audit_analysis
from attnjax.experiment.margins import Comparison, decisive, smallest
from attnjax.experiment.parts import Part, checks_text, run_checks, witness_result
from attnjax.experiment.recompute import CSV_FILES
from attnjax.experiment.record import parse_rows
from attnjax.experiment.report import METRIC_RANGES, mean_ci95
from attnjax.experiment.sweep import VERDICTS, Experiment, Stats, Summary, summarize

FRAGILE_BELOW = 0.9  # bootstrap agreement under which a verdict is fragile
SYNTHETIC_DRAWS = 400  # random synthetic summaries per reachability check
ANALYSIS_DRAWS = 200  # perturbed tables and seed resamplings per analysis (AUDIT_DRAWS: fewer)
TIED_LEVELS = 101  # levels at which every point is tied (steps of 1% of the metric's range)
POINT_LEVELS = 5  # levels (quarters of the range) that each point takes on its own, seeds near it


@dataclasses.dataclass(frozen=True)
class Audit:
    """What the audit found for one experiment's committed summary."""

    claim_id: str
    verdict: str  # the rule's verdict on the committed summary
    reachable: tuple[str, ...]  # the verdicts the rule gives on synthetic summaries
    agreement: float | None  # share of bootstrap draws with the committed verdict (None:
    draws: int  # a deterministic analysis, no seed axis)
    edges: tuple[str, ...]  # points whose chosen learning rate is at an edge of its grid
    margins: tuple[Comparison, ...] = ()  # the decisive comparisons
    checks: tuple[tuple[str, bool], ...] = ()  # (name, passed) per declared check
    parts: tuple["PartAudit", ...] = ()
    raised: tuple[int, int] = (0, 0)  # an analysis: perturbed tables the rule raised on, of all

    @property
    def margin(self) -> Comparison | None:
        """The decisive comparison with the smallest margin (None if none was traced)."""
        return smallest(self.margins)

    @property
    def flags(self) -> tuple[str, ...]:
        never = {"unrefutable": "refuted", "unsupportable": "supported"}
        flags = [flag for flag, v in never.items() if v not in self.reachable]
        if self.agreement is not None and self.agreement < FRAGILE_BELOW:
            flags.append("fragile")
        if self.edges:
            flags.append("edge")
        if not all(passed for _, passed in self.checks):
            flags.append("check-failed")
        flags += [f"can-refuted-by-training ({p.name})" for p in self.parts if p.refutable]
        if self.raised[1] and self.raised[0] == self.raised[1]:
            flags.append("raises-on-every-perturbation")
        return tuple(flags)


@dataclasses.dataclass(frozen=True)
class PartAudit:
    """A declared part: its ``kind``, what supports it (``"witness 1.000"``, ``"impossibility:
    …"``, ``"training"``) and, for a *can* part resting on training alone, whether its rule
    can give *refuted* (``refutable``: the rule is flagged)."""

    name: str
    kind: str
    support: str
    refutable: bool = False

    def __str__(self) -> str:
        return f"{self.kind}: {self.name} ({self.support})"


def audit(experiment: Experiment, summary: Summary, *, draws: int = 1000, seed: int = 0) -> Audit:
    """Reachability, bootstrap agreement and edges of ``experiment``'s rule on ``summary``."""
    verdict = _verdict(experiment.verdict, summary)
    rng = np.random.default_rng(seed)
    return Audit(
        claim_id=experiment.claim_id,
        verdict=verdict,
        reachable=reachable(experiment, summary, rng),
        agreement=bootstrap_agreement(experiment.verdict, summary, verdict, draws, rng),
        draws=draws,
        edges=tuple(name for name, s in summary.labels().items() if s.at_edge),
        margins=decisive(experiment.verdict, summary),
        checks=run_checks(experiment.checks),
        parts=tuple(audit_part(experiment, p, summary, rng) for p in experiment.parts),
    )


def audit_part(
    experiment: Experiment, part: Part, summary: Summary, rng: np.random.Generator
) -> PartAudit:
    """What supports ``part``; a *can* part on training alone is ``refutable`` when its rule
    (``part.rule``, else the experiment's) reaches *refuted* on synthetic summaries."""
    if part.kind == "does":
        return PartAudit(part.name, part.kind, "training")
    found = witness_result(part, experiment.solved_at, experiment.higher_is_better)
    if found and found[1]:
        return PartAudit(part.name, part.kind, f"witness {found[0]:.3f}")
    if part.impossibility:
        return PartAudit(part.name, part.kind, f"impossibility: {part.impossibility}")
    rule = part.rule or experiment.verdict
    refutable = "refuted" in reachable(dataclasses.replace(experiment, verdict=rule), summary, rng)
    short = f"training; witness {found[0]:.3f} short of its bar" if found else "training"
    return PartAudit(part.name, part.kind, short, refutable)


def reachable(experiment: Experiment, summary: Summary, rng: np.random.Generator) -> tuple:
    """The verdicts the rule gives on synthetic summaries shaped like ``summary``: per-seed
    values uniform over the metric's range, every point at the low or the high end (all,
    and at random), all points tied at each of :data:`TIED_LEVELS` levels spread evenly
    over the range (ends and middle included), which reach rules that ask for points inside a
    narrow band, and each point at its own random level of :data:`POINT_LEVELS` with its seeds
    near it (narrow intervals, the same jitter for every point: paired differences near 0),
    which reach rules that ask for some points at an end, others mid-range and tied."""
    low, high = _metric_range(experiment.metric, summary)
    num_points, num_seeds = len(summary), max(len(s.values) for _, s in summary)
    grids = [rng.uniform(low, high, (num_points, num_seeds)) for _ in range(SYNTHETIC_DRAWS)]
    ends = [np.where(rng.random((num_points, 1)) < 0.5, low, high) for _ in range(SYNTHETIC_DRAWS)]
    grids += [np.broadcast_to(e, (num_points, num_seeds)) for e in ends]
    grids += [np.full((num_points, num_seeds), v) for v in np.linspace(low, high, TIED_LEVELS)]
    levels = np.linspace(low, high, POINT_LEVELS)
    jitter = 0.002 * (high - low)  # seeds near their point's level, so intervals stay narrow
    near = [rng.choice(levels, (num_points, 1)) + rng.uniform(-jitter, jitter, (1, num_seeds))
            for _ in range(SYNTHETIC_DRAWS)]  # fmt: skip
    grids += [np.clip(g, low, high) for g in near]
    found = {_verdict(experiment.verdict, _with_values(summary, g)) for g in grids}
    return tuple(v for v in VERDICTS if v in found)


def bootstrap_agreement(
    rule: Callable[[Summary], tuple[str, str]],
    summary: Summary,
    verdict: str,
    draws: int,
    rng: np.random.Generator,
) -> float:
    """The share of ``draws`` seed resamplings (with replacement, the same seeds for every
    point) whose verdict is ``verdict``."""
    values = [np.asarray(s.values, float) for _, s in summary]
    num_seeds = min(len(v) for v in values)
    same = 0
    for _ in range(draws):
        seeds = rng.integers(0, num_seeds, num_seeds)
        resampled = _with_values(summary, [v[seeds] for v in values])
        same += _verdict(rule, resampled) == verdict
    return same / draws


def _with_values(summary: Summary, values: Sequence[np.ndarray] | np.ndarray) -> Summary:
    """``summary`` with each point's per-seed test values replaced (mean and interval
    recomputed; the learning rates and their means kept)."""
    entries = []
    for (point, stats), new in zip(summary, values, strict=True):
        new = tuple(float(x) for x in new)
        entries.append((point, Stats(*mean_ci95(new), new, *stats[3:])))
    return Summary(entries)


def _metric_range(metric: str, summary: Summary) -> tuple[float, float]:
    """The metric's declared range, else the committed values' range widened by half its
    width on each side (at least 1)."""
    if metric in METRIC_RANGES:
        return METRIC_RANGES[metric]
    values = [v for _, s in summary for v in s.values if math.isfinite(v)]
    low, high = min(values), max(values)
    pad = max((high - low) / 2, 1.0)
    return low - pad, high + pad


def _verdict(rule: Callable[[Summary], tuple[str, str]], summary: Summary) -> str:
    verdict = rule(summary)[0]
    if verdict not in VERDICTS:
        raise ValueError(f"verdict: expected one of {VERDICTS}, got {verdict!r}")
    return verdict


def audit_table(audits: Mapping[str, Audit | Sequence[Audit]]) -> str:
    """A markdown table: one row per audited experiment and claim."""
    rows = ["| experiment | claim | verdict | reachable | bootstrap agreement | smallest margin "
            "| checks | parts | flags |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, found in audits.items():
        for a in (found,) if isinstance(found, Audit) else found:
            rows.append(
                f"| {name} | {a.claim_id} | {a.verdict} | {reachable_text(a)} | "
                f"{agreement_text(a)} | {margin_text(a)} | "
                f"{checks_text(a.checks) or '–'} | {'; '.join(map(str, a.parts)) or '–'} | "
                f"{', '.join(a.flags) or '–'} |"
            )
    return "\n".join(rows) + "\n"


def reachable_text(a: Audit) -> str:
    """The reachable verdicts; for an analysis, of how many perturbed tables and on how many
    the rule raised."""
    text = ", ".join(a.reachable)
    raised, tried = a.raised
    if tried:
        text += f" (of {tried} perturbed tables" + (f"; raised on {raised})" if raised else ")")
    return text


def agreement_text(a: Audit) -> str:
    if a.agreement is None:
        return "deterministic (no seed axis)"
    return f"{a.agreement:.1%} of {a.draws}"


def margin_text(a: Audit) -> str:
    """``"0.29 SE: <comparison>"`` for the smallest decisive margin; why there is none."""
    c = a.margin
    if a.raised[1]:
        return "– (an analysis)"
    if c is None:
        return "– (no traced comparison decides it)" if not a.margins else "– (one seed)"
    size = "∞" if math.isinf(c.margin) else f"{c.margin:.2f}"
    return f"{size} SE: `{c}`".replace("|", "\\|")


def audited(root: Path) -> list[str]:
    """The experiments with a committed record under ``root``: ``results/<name>/`` holding
    ``results.csv`` beside ``experiments/<name>.py`` that defines ``get_experiment()`` (a trained
    sweep) or ``analyze`` (an analysis; some define both)."""
    names = []
    for table in sorted((root / "results").glob("*/results.csv")):
        path = root / "experiments" / f"{table.parent.name}.py"
        if path.is_file() and _kinds(path.read_text()):
            names.append(table.parent.name)
    return names


def _kinds(source: str) -> tuple[str, ...]:
    """``"analysis"`` (it defines ``analyze``) and ``"sweep"`` (``get_experiment``), in the
    order their sections stand in its report."""
    kinds = {"analysis": "def analyze(", "sweep": "def get_experiment("}
    return tuple(kind for kind, marker in kinds.items() if marker in source)


def audit_records(
    root: Path,
    names: Sequence[str] = (),
    draws: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, tuple[Audit, ...]]:
    """The audits of each named committed record (default: every :func:`audited` one), one per
    claim it judges: its analysis's claims (``ANALYSIS_DRAWS`` draws unless the experiment file
    declares ``AUDIT_DRAWS``), then its trained sweep's (``draws``); every name is checked
    before any is audited; ``progress(name)`` before each."""
    names = list(names or audited(root))
    for name in names:
        path, table = root / "experiments" / f"{name}.py", root / "results" / name / "results.csv"
        if not path.is_file() or not table.is_file():
            raise ValueError(f"experiment: {name} needs experiments/{name}.py and {table}")
        if not _kinds(path.read_text()):
            raise ValueError(f"experiment: {name} defines neither analyze nor get_experiment()")
    found = {}
    for name in names:
        if progress is not None:
            progress(name)
        path, folder = root / "experiments" / f"{name}.py", root / "results" / name
        texts = tuple((n, (folder / n).read_text()) for n in CSV_FILES if (folder / n).is_file())
        found[name] = _audit_record(str(path.resolve()), path.read_text(), texts, draws)
    return found


@functools.cache
def _audit_record(
    path: str, source: str, tables: tuple[tuple[str, str], ...], draws: int
) -> tuple[Audit, ...]:
    """One record's audits from its tables' texts, cached by the experiment file's resolved
    path, its source and the texts (a test or a check that audits them again, in a copy of
    the repository whose experiments/ links to this one, gets them free)."""
    from attnjax.experiment import load_file  # the package imports this module

    module, texts = load_file(path), dict(tables)
    found = []
    for kind in _kinds(source):
        if kind == "analysis":
            found += analysis_audits(module, {n: parse_rows(t) for n, t in tables})
        else:
            experiment = module.get_experiment()
            rows = parse_rows(texts["results.csv"])
            found.append(audit(experiment, summarize(experiment, rows)[0], draws=draws))
    return tuple(found)


def analysis_audits(module: Any, tables: dict[str, list[dict]]) -> list[Audit]:
    """The audit of each claim of ``module``'s ``report_from_rows`` on ``tables``, with the
    module's optional ``AUDIT_KEYS``, ``AUDIT_MEASURED`` and ``AUDIT_DRAWS``. A module whose
    report is slow to make may give ``verdicts_from_rows(tables)``, its verdicts alone: the
    audit's rule, which must give the report's verdicts on the committed tables."""
    draws = getattr(module, "AUDIT_DRAWS", ANALYSIS_DRAWS)
    rule = getattr(module, "verdicts_from_rows", None)
    if rule is None:
        rule = lambda t: module.report_from_rows(t).verdicts  # noqa: E731
    else:
        fast, full = rule(tables), module.report_from_rows(tables).verdicts
        if {c: v for c, (v, _) in fast.items()} != {c: v for c, (v, _) in full.items()}:
            raise ValueError(
                f"{module.__name__}: verdicts_from_rows gives {fast}, its report {full}"
            )
    found = audit_analysis(
        rule,
        tables,
        count=draws,
        draws=draws,
        keys=getattr(module, "AUDIT_KEYS", ()),
        measured=getattr(module, "AUDIT_MEASURED", ()),
    )
    return [
        Audit(claim, a["verdict"], tuple(v for v in VERDICTS if v in a["reachable"]),
              a["agreement"], a["draws"], (), raised=(a["raised"], a["tried"]))
        for claim, a in found.items()
    ]  # fmt: skip
