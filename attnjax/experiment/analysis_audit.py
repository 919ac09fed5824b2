"""The audit of an analysis (an experiment's ``analyze``, judged by its ``report_from_rows(tables)``
on the record's ``analysis.csv``/``results.csv``), as a referee would run it.

- **Keys and measurements**: a column that identifies a row is a key and never changes
  (:func:`key_columns`); every other numeric column is a measurement.
- **Reachability**: the verdicts of ``report_from_rows`` on perturbed copies of the tables it
  reads: every measurement moved toward either end of its widened range, tied at levels across
  it, permuted across rows (which breaks trends and pairings), drawn uniformly or at the ends,
  shifted by a random effect per point (which moves the differences paired rules judge); each
  column alone and all together. A perturbation on which the rule raises is counted, not
  judged.
- **Fragility**: where a table the rule reads has a seed axis, the seeds are resampled with
  replacement (the same draw for every row group: a row takes the measurements of the row with
  the same keys at the drawn seed), ``draws`` times from a fixed key; without one the record is
  *deterministic* and gets no agreement.

An experiment file may declare ``AUDIT_KEYS`` / ``AUDIT_MEASURED`` (column names that the
default rule gets wrong) and ``AUDIT_DRAWS`` (fewer tables and draws for a slow rule).
"""

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from attnjax.experiment.parts import reusing_checks

Tables = dict[str, list[dict[str, Any]]]
Rule = Callable[[Tables], Mapping[str, tuple[str, str]]]  # tables -> {claim: (verdict, reason)}
BASE_KEYS = ("point", "seed", "learning_rate", "rates", "chosen")  # a run's identity
TIED_LEVELS = 11  # levels (0%, 10%, …, 100% of a widened range) at which columns are tied
SCALED = (0.5, 1.0)  # fractions of the way to either end that every measurement is moved


def key_columns(
    rows: Sequence[dict[str, Any]], keys: Sequence[str] = (), measured: Sequence[str] = ()
) -> set[str]:
    """The columns of ``rows`` that identify a row rather than measure it: those in ``keys``
    and :data:`BASE_KEYS`; columns with no numeric value (text, flags, empty); columns named in
    the point labels (``tau=0.001`` names ``tau`` and ``model.tau``); integer columns constant
    among the rows that share their text columns (head counts, sizes); and grid axes (a column
    that runs through the same values, at least two, in every (point, seed) group of several
    rows).
    ``measured`` overrides."""
    columns = list(dict.fromkeys(c for r in rows for c in r))
    named = {t.split("=")[0] for r in rows for t in str(r.get("point", "")).split() if "=" in t}
    text = [c for c in columns if any(isinstance(r.get(c), str) for r in rows)]
    found = {c for c in columns if c in keys or c in BASE_KEYS or c in named}
    found |= {c for c in columns if c.rsplit(".", 1)[-1] in named}
    for c in set(columns) - found:
        numbers = [r.get(c) for r in rows if _is_number(r.get(c))]
        if not numbers or (
            all(isinstance(v, int) for v in numbers) and _constant_within(rows, c, text)
        ):
            found.add(c)
            continue
        runs = {g for g in _groups(rows, c, ("point", "seed")) if len(g) > 1}
        if len(runs) == 1 and len(set(next(iter(runs))) - {None}) > 1:
            found.add(c)  # a grid axis
    return found - set(measured)


def _groups(rows: Sequence[dict], column: str, by: Sequence[str]) -> set[tuple]:
    """The sequences of ``column``'s values within each group of rows sharing ``by``."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(b) for b in by), []).append(r.get(column))
    return {tuple(g) for g in groups.values()}


def _constant_within(rows: Sequence[dict], column: str, by: Sequence[str]) -> bool:
    return all(len(set(g)) == 1 for g in _groups(rows, column, by))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Reads(dict):
    """Tables that record which of them the rule reads."""

    def __init__(self, tables: Tables):
        super().__init__(tables)
        self.read: set[str] = set()

    def __getitem__(self, name: str):
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name: str, default=None):
        self.read.add(name)
        return super().get(name, default)


def read_tables(rule: Rule, tables: Tables) -> tuple[dict[str, str], list[str]]:
    """``({claim: verdict}, names of the tables the rule read)`` on ``tables``."""
    tracked = _Reads(tables)
    return _verdicts(rule, tracked), [t for t in tables if t in tracked.read] or list(tables)


def _verdicts(rule: Rule, tables: Tables) -> dict[str, str]:
    return {claim: verdict for claim, (verdict, _) in rule(tables).items()}


class _Column:
    """One measured column of one table: its cells that may change (finite numbers; empty cells
    too where a point has both, an event that may or may not happen) and its widened range."""

    def __init__(self, table: str, name: str, rows: list[dict]):
        self.table, self.name = table, name
        cells = [r.get(name) for r in rows]
        events = any(None in g and len(set(g)) > 1 for g in _groups(rows, name, ("point",)))
        self.events = events
        self.rows = [i for i, v in enumerate(cells) if _is_number(v) or (events and v is None)]
        numbers = np.array([cells[i] for i in self.rows if cells[i] is not None], float)
        self.empty = 1 - len(numbers) / len(self.rows)  # share of empty cells
        self.integer = all(isinstance(cells[i], int) for i in self.rows if cells[i] is not None)
        low, high = float(numbers.min()), float(numbers.max())
        pad = (high - low) / 2 or abs(low) / 2 or 1.0
        self.low, self.high = low - pad, high + pad

    def cast(self, value: float | int | None):
        if value is None or not self.integer:
            return value
        return round(value)

    def drawn(self, rng: np.random.Generator, draw: Callable[[int], np.ndarray]) -> list:
        """New cells: ``draw(n)`` numbers, empty at the column's rate of empty cells."""
        values = draw(len(self.rows))
        empty = rng.random(len(self.rows)) < self.empty
        return [None if e else float(v) for v, e in zip(values, empty, strict=True)]


def perturbations(
    tables: Tables, keys: dict[str, set[str]], count: int, rng: np.random.Generator
) -> Iterator[Tables]:
    """``count`` perturbed copies of ``tables`` (only their measured columns change): all
    measurements moved toward either end (:data:`SCALED`) and tied at :data:`TIED_LEVELS`
    levels; each column alone at either end; each measurement with an interval (``X``,
    ``X_low``, ``X_high``) tied at each level with its interval; each column of events (a
    step, or empty where none happened) given another's events; then, in turn, every column, a
    random half of them or one column permuted across rows, drawn uniformly over its widened
    range, drawn at its ends, or shifted by an effect per point (every row of a point moved by
    one offset drawn within half the range: the differences between points that paired rules
    judge)."""
    columns = [
        _Column(t, c, rows)
        for t, rows in tables.items()
        for c in dict.fromkeys(c for r in rows for c in r)
        if c not in keys[t]
    ]
    if not columns:
        return

    def at(level: float) -> Callable[[_Column], list]:
        return lambda col: [col.low + level * (col.high - col.low)] * len(col.rows)

    def toward(fraction: float, end: str) -> Callable[[_Column], list]:
        def move(col: _Column) -> list:
            target = getattr(col, end)
            old = [tables[col.table][i][col.name] for i in col.rows]
            return [None if v is None else v + fraction * (target - v) for v in old]

        return move

    def permuted(col: _Column) -> list:
        old = [tables[col.table][i][col.name] for i in col.rows]
        return [old[i] for i in rng.permutation(len(old))]

    def uniform(col: _Column) -> list:
        return col.drawn(rng, lambda n: rng.uniform(col.low, col.high, n))

    def ends(col: _Column) -> list:
        return col.drawn(rng, lambda n: np.where(rng.random(n) < 0.5, col.low, col.high))

    def shifted(col: _Column) -> list:  # an effect per point: its rows move together
        rows = tables[col.table]
        groups = [str(rows[i].get("point", _identity(rows[i], keys[col.table] - {"seed"})))
                  for i in col.rows]  # fmt: skip
        span = (col.high - col.low) / 2
        offset = {g: rng.uniform(-span, span) for g in dict.fromkeys(groups)}
        old = [rows[i][col.name] for i in col.rows]
        return [None if v is None else v + offset[g] for v, g in zip(old, groups, strict=True)]

    def each(change: Callable[[_Column], list], cols: Sequence[_Column]) -> Callable[[], dict]:
        return lambda: {(c.table, c.name): (c, change(c)) for c in cols}

    plans = [each(toward(f, end), columns) for f in SCALED for end in ("low", "high")]
    plans += [each(at(q), columns) for q in np.linspace(0, 1, TIED_LEVELS)]
    plans += [each(at(q), [col]) for col in columns for q in (0.0, 1.0)]
    plans += [_interval_at(tables, g, q) for g in _intervals(columns)
              for q in np.linspace(0, 1, TIED_LEVELS)]  # fmt: skip
    events = [c for c in columns if c.events]
    plans += [each(lambda c, a=a: [tables[a.table][i][a.name] for i in c.rows], [b])
              for a in events for b in events if a is not b and a.rows == b.rows]  # fmt: skip
    families = (permuted, uniform, ends, shifted)
    for made in range(count):
        if made < len(plans):
            yield _changed(tables, plans[made]())
            continue
        change = families[made % len(families)]
        chosen = [
            columns,  # every column
            [c for c in columns if rng.random() < 0.5] or [rng.choice(columns)],  # some
            [rng.choice(columns)],  # one
        ][(made // len(families)) % 3]
        yield _changed(tables, each(change, chosen)())


def _intervals(columns: Sequence[_Column]) -> list[list[_Column]]:
    """Measurements with an interval: ``[X, X_low, X_high]`` columns of one table."""
    named = {(c.table, c.name): c for c in columns}
    return [
        [c, named[c.table, f"{c.name}_low"], named[c.table, f"{c.name}_high"]]
        for c in columns
        if (c.table, f"{c.name}_low") in named and (c.table, f"{c.name}_high") in named
    ]


def _interval_at(tables: Tables, group: list[_Column], level: float) -> Callable[[], dict]:
    """A measurement tied at ``level`` of its widened range, its interval moved with it (each
    row's bounds keep their offsets from its value)."""

    def change() -> dict:
        value, *bounds = group
        target = value.low + level * (value.high - value.low)
        rows = tables[value.table]
        new = {(value.table, value.name): (value, [target] * len(value.rows))}
        for b in bounds:
            shifted = []
            for i in b.rows:
                v, old = rows[i].get(value.name), rows[i][b.name]
                ok = _is_number(v) and old is not None
                shifted.append(old - v + target if ok else old)
            new[b.table, b.name] = (b, shifted)
        return new

    return change


def _changed(tables: Tables, new: dict[tuple[str, str], tuple[_Column, list]]) -> Tables:
    out = {t: [dict(r) for r in rows] for t, rows in tables.items()}
    for (table, name), (col, values) in new.items():
        for i, value in zip(col.rows, values, strict=True):
            out[table][i][name] = col.cast(value)
    return out


def reachable(
    rule: Rule, tables: Tables, keys: dict[str, set[str]], count: int, rng: np.random.Generator
) -> tuple[dict[str, set[str]], int, int]:
    """``({claim: verdicts reached}, perturbations tried, perturbations the rule raised on)``;
    the committed tables' verdicts count as reached."""
    found = {c: {v} for c, v in _verdicts(rule, tables).items()}
    tried = raised = 0
    for perturbed in perturbations(tables, keys, count, rng):
        tried += 1
        try:
            verdicts = _verdicts(rule, perturbed)
        except Exception:  # a value outside the rule's domain: counted, not judged
            raised += 1
            continue
        for claim, verdict in verdicts.items():
            found.setdefault(claim, set()).add(verdict)
    return found, tried, raised


def has_seed_axis(tables: Tables) -> bool:
    """Whether some table has several seeds (rows per initialization or run)."""
    return len(_seeds(tables)) > 1


def _seeds(tables: Tables) -> list[int]:
    """The seeds of the rows (integers; a summary row's ``mean`` is no seed)."""
    found = {r.get("seed") for rows in tables.values() for r in rows}
    return sorted(s for s in found if isinstance(s, int) and not isinstance(s, bool))


def bootstrap(
    rule: Rule,
    tables: Tables,
    keys: dict[str, set[str]],
    committed: dict[str, str],
    draws: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    """``{claim: share of draws with the committed verdict}`` over ``draws`` resamplings of the
    seeds (with replacement; the same draw for every table and row group). A row keeps its keys
    and its seed and takes the measurements of the row with the same keys at the drawn seed; a
    draw on which the rule raises disagrees."""
    seeds = _seeds(tables)
    index = {t: {_identity(r, keys[t]): r for r in rows} for t, rows in tables.items()}
    same = dict.fromkeys(committed, 0)
    for _ in range(draws):
        drawn = dict(zip(seeds, rng.choice(seeds, len(seeds)), strict=True))
        out = {}
        for t, rows in tables.items():
            out[t] = []
            for r in rows:
                if r.get("seed") not in drawn:
                    out[t].append(r)
                    continue
                source = index[t].get(_identity({**r, "seed": drawn[r["seed"]]}, keys[t]), r)
                out[t].append({**source, **{k: r[k] for k in keys[t] if k in r}})
        try:
            verdicts = _verdicts(rule, out)
        except Exception:
            continue
        for claim, verdict in committed.items():
            same[claim] += verdicts.get(claim) == verdict
    return {claim: n / draws for claim, n in same.items()}


def _identity(row: dict, keys: set[str]) -> tuple:
    return tuple(sorted((k, str(row[k])) for k in keys if k in row))


def audit_analysis(
    rule: Rule,
    tables: Tables,
    *,
    count: int = 120,
    draws: int = 200,
    keys: Sequence[str] = (),
    measured: Sequence[str] = (),
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per claim of ``rule`` on ``tables``: ``verdict``, ``reachable`` (a set), ``tried`` and
    ``raised`` (perturbations), ``agreement`` (None when deterministic) and ``draws``. Only the
    tables the rule reads are perturbed and resampled."""
    with reusing_checks():
        committed, read = read_tables(rule, tables)
        tables = {t: copy.deepcopy(tables[t]) for t in read}
        key_sets = {t: key_columns(rows, keys, measured) for t, rows in tables.items()}
        rng = np.random.default_rng(seed)
        reached, tried, raised = reachable(rule, tables, key_sets, count, rng)
        agreement = (
            bootstrap(rule, tables, key_sets, committed, draws, rng)
            if has_seed_axis(tables)
            else {}
        )
    return {
        claim: {"verdict": v, "reachable": reached[claim], "tried": tried, "raised": raised,
                "agreement": agreement.get(claim), "draws": draws if agreement else 0}
        for claim, v in committed.items()
    }  # fmt: skip
