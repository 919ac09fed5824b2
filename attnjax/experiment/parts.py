"""What an experiment declares about its claim besides its rule: the parts that hold by
construction (:class:`Check`: an identity, a theorem, an initialization fact, checked and
reported, never counted in a verdict) and the kind of each part it judges (:class:`Part`:
*can*, something some parameters achieve, or *does*, something training does), with, for a
*can* part, a witness (hand-set parameters of the same model class that solve the task) or a
pointer to an impossibility argument.

Failed training is evidence that training did not find parameters, not that none exist: a
*can* part with neither a witness nor an impossibility argument may not be refuted by
training alone, and the audit flags a rule that can refute one (``can-refuted-by-training``).
"""

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

KINDS = ("can", "does")
CHECK_KINDS = ("identity", "theorem", "initialization")


@dataclasses.dataclass(frozen=True)
class Check:
    """A part of the claim that holds by construction: ``test()`` is True when it holds (a
    cheap computation: an identity, a theorem's bound, a fact at initialization). ``kind`` is
    one of :data:`CHECK_KINDS`."""

    name: str
    test: Callable[[], bool]
    kind: str = "identity"

    def __post_init__(self):
        if self.kind not in CHECK_KINDS:
            raise ValueError(f"check {self.name!r}: kind {self.kind!r} not in {CHECK_KINDS}")


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of the claim the experiment judges: ``kind`` *can* or *does*. ``rule(summary) ->
    (verdict, reason)`` judges this part alone (None: the experiment's whole rule). A *can*
    part may have a ``witness() -> metric``: hand-set parameters in the experiment's model
    class, evaluated on its task; reaching ``bar`` (default: the experiment's ``solved_at``)
    supports the part on its own. ``impossibility`` names the argument (a theorem, a test)
    that no parameters achieve it, which lets training refute it."""

    name: str
    kind: str
    rule: Callable[[Any], tuple[str, str]] | None = None
    witness: Callable[[], float] | None = None
    bar: float | None = None
    impossibility: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"part {self.name!r}: kind {self.kind!r} not in {KINDS}")
        if self.kind == "does" and (self.witness or self.impossibility):
            raise ValueError(f"part {self.name!r}: a witness or impossibility is for a can part")


_reused: dict[Callable[[], bool], bool] | None = None  # set by reusing_checks()


@contextlib.contextmanager
def reusing_checks() -> Iterator[None]:
    """While active, a check whose test captures nothing (a function with no closure, so it
    cannot see the rows a report is recomputed from) runs once and its result is reused: the
    audit recomputes an analysis's report on hundreds of perturbed tables."""
    global _reused
    outer, _reused = _reused, {} if _reused is None else _reused
    try:
        yield
    finally:
        _reused = outer


def run_checks(checks: tuple[Check, ...]) -> tuple[tuple[str, bool], ...]:
    """``(name, passed)`` per check; a check that raises fails."""
    results = []
    for check in checks:
        reuse = _reused is not None and getattr(check.test, "__closure__", 0) is None
        if reuse and check.test in _reused:
            passed = _reused[check.test]
        else:
            try:
                passed = bool(check.test())
            except Exception:  # a check that cannot run does not pass
                passed = False
            if reuse:
                _reused[check.test] = passed
        results.append((check.name, passed))
    return tuple(results)


def witness_result(
    part: Part, solved_at: float | None, higher_is_better: bool
) -> tuple[float, bool] | None:
    """``(metric, supports)`` of ``part``'s witness: the metric its hand-set parameters reach
    and whether that reaches the bar (``part.bar``, else ``solved_at``); None without a
    witness. A witness with no bar supports nothing."""
    if part.witness is None:
        return None
    bar = part.bar if part.bar is not None else solved_at
    value = float(part.witness())
    if bar is None:
        return value, False
    return value, bool(value >= bar if higher_is_better else value <= bar)


def checks_text(results: tuple[tuple[str, bool], ...]) -> str:
    """``"name: pass; name: FAIL"`` (markdown-safe), or ``""`` for none."""
    return "; ".join(f"{name}: {'pass' if ok else 'FAIL'}" for name, ok in results)


def declared_notes(experiment: Any, record_seeds: Sequence[int]) -> str:
    """What the experiment declares beside its rule, for its report (``""`` when nothing):
    its checks (pass/fail, not counted in the verdict), its parts' kinds and witnesses, and its
    pilot seeds against the record's (``record_seeds``). ``experiment``: an
    :class:`attnjax.experiment.sweep.Experiment`."""
    notes = []
    if experiment.checks:
        notes.append(
            "**Checks** (hold by construction; not evidence, not counted in the verdict): "
            f"{checks_text(run_checks(experiment.checks))}."
        )
    for part in experiment.parts:
        found = witness_result(part, experiment.solved_at, experiment.higher_is_better)
        support = (
            f"witness (hand-set parameters) reaches {found[0]:.3f}"
            + (", which supports it on its own" if found[1] else ", short of its bar")
            if found
            else f"impossibility: {part.impossibility}"
            if part.impossibility
            else "judged by training only"
        )
        notes.append(f"**Part ({part.kind}): {part.name}.** {support}.")
    if experiment.pilot_seeds:
        notes.append(
            f"**Seeds.** Record seeds {list(record_seeds)}; pilot seeds "
            f"{list(experiment.pilot_seeds)} (used while designing it) are not among them."
        )
    return "".join(f"{n}\n\n" for n in notes)
