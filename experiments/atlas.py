"""The expressiveness atlas: every named score on every synthetic task column, with one or two
heads and one or two layers, at matched parameter counts (CLAIMS A1-A3, declared before the
run).

Columns. The expressiveness tasks at their claims' settings, each from its config file
(xor_relation E1, min_of_keys E3, impostor E4, copy E7, mqar E6); MAD's six tasks (Poli et
al. 2024: in-context, noisy and fuzzy recall, selective copying, compression, memorization)
and a RegBench-style automaton task (Akyürek et al. 2024), each at an easy and a hard level
(longer sequences, larger vocabularies, more noise, more states), on a causal transformer with
RoPE, MLP and LayerNorm of width 64, 1000 steps, batch 64, and an extrapolation split at twice
the training length.

Cells. score × heads {1, 2} × layers {1, 2} per column. Matched parameters: each cell's width
is the largest multiple of 4 up to the column's width whose model has at most the parameters
of the scaled-dot model at the column's width (+1%, which lets cosine's per-head scales
through): the bilinear and additive scores' extra matrices are paid for with width, so they
never buy capacity (``attnjax.experiment.atlas.matched_width``). Rates: every cell starts at
1e-3, 3e-3, 1e-2 and grows by 3× while its best rate (on validation) is at an edge, within
1e-4 to 0.1; accuracy is the test split's at that rate. Seeds 300-304 (pilots: 100+). A seed
*solves* a cell when its test accuracy is at least 0.9; a score *solves* a column when ≥ 4 of
5 seeds do, *fails* it when ≤ 1 does.

Claims and rules (every seed pairs with the same seed at every cell of a column: each seed's
training data and test draws are the same; initializations differ with the shapes):

A1. One additive head solves every task that one multiplicative head solves. At one head, for
each column and layer count: where a multiplicative score (dot, scaled_dot, bilinear) solves
the column, an additive score (additive, additive_relu) must solve it. Supported iff some
(column, layers) is solved by a multiplicative score and every such one is solved by an
additive score; refuted iff some such (column, layers) is failed by both additive scores;
else inconclusive.

A2. On recall tasks the scores tie at two layers. Recall columns: mqar and both levels of
in-context, noisy and fuzzy recall. At two layers, each head count, every score against
scaled_dot, paired by seed: (i) over the recall columns together (pairs = column × seed), the
mean difference lies within ±0.05 (two one-sided 95% bounds); (ii) no single column's paired
difference lies beyond ±0.05 at 99% (one-sided). Supported iff (i) holds for every score and
head count and (ii) finds nothing; refuted iff (i)'s bound lies wholly beyond ±0.05 for some
score and head count (one-sided 95%), or (ii) finds a column; else inconclusive.

A3. Cosine with a learnable scale matches scaled dot. The same two tests as A2, cosine against
scaled_dot, over every column at every head and layer setting. Supported, refuted and
inconclusive as in A2.

Reported, not judged: MAD's score per score and setting (mean test accuracy over the 14 MAD
columns), the same on the extrapolation split, parameters and training FLOPs per cell.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnjax import tasks as registry
from attnjax.experiment import (
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    load_file,
    record,
    with_overrides,
)
from attnjax.experiment import atlas as plan
from attnjax.experiment import stats as st
from attnjax.experiment.rates import AutoRates
from attnjax.experiment.report import markdown_table, save_figure

_CONFIGS = Path(__file__).parents[1] / "configs"
SCORES = ("dot", "scaled_dot", "bilinear", "additive", "additive_relu", "cosine")
SMOKE_SCORES = ("scaled_dot", "additive")
MULTIPLICATIVE, ADDITIVE = ("dot", "scaled_dot", "bilinear"), ("additive", "additive_relu")
SETTINGS = ((1, 1), (1, 2), (2, 1), (2, 2))  # (heads, layers)
RATES = AutoRates((1e-3, 3e-3, 1e-2), factor=3.0, bounds=(1e-4, 0.1))
SEEDS, FIRST_SEED, PILOT_SEEDS = 5, 300, tuple(range(100, 110))
SOLVED, SOLVES, FAILS = 0.9, 4, 1  # a seed's bar; seeds of 5 that solve / fail a column
MARGIN, COLUMN_CONFIDENCE = 0.05, 0.99
RECALL = ("mqar", "in_context_recall", "noisy_recall", "fuzzy_recall")
AUDIT_KEYS = ("column", "model.width", "params", "flops_per_step", "train_flops")
# The MAD and automaton tasks at their two levels: the task's config fields per level.
LEVELS = {
    "in_context_recall": (dict(vocab_size=16, seq_len=32), dict(vocab_size=32, seq_len=64)),
    "noisy_recall": (
        dict(vocab_size=24, noise_vocab_size=8, frac_noise=0.2, seq_len=32),
        dict(vocab_size=40, noise_vocab_size=8, frac_noise=0.4, seq_len=64),
    ),
    "fuzzy_recall": (
        dict(vocab_size=17, seq_len=32, key_size=2, value_size=2),
        dict(vocab_size=33, seq_len=64, key_size=3, value_size=3),
    ),
    "selective_copying": (
        dict(vocab_size=16, seq_len=32, num_tokens=4),
        dict(vocab_size=16, seq_len=64, num_tokens=8),
    ),
    "compression": (dict(vocab_size=16, seq_len=16), dict(vocab_size=16, seq_len=32)),
    "memorization": (dict(vocab_size=64, seq_len=32), dict(vocab_size=256, seq_len=32)),
    "automaton": (dict(num_states=4, seq_len=64), dict(num_states=6, seq_len=128)),
}
EXPRESSIVENESS = ("xor_relation", "impostor", "copy", "mqar", "min_of_keys")


def _level_config(task: str, fields: Mapping[str, Any], smoke: bool) -> ExperimentConfig:
    return ExperimentConfig(
        name=task,
        task=registry.get(task).config(**fields),
        model=dict(kind="transformer", width=64, layers=1, heads=1, positional="rope", causal=True),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=20 if smoke else 1000,
            eval_every=10 if smoke else 250,
            batch_size=64,
            eval_batch_size=32 if smoke else 512,
            seed=FIRST_SEED,
            extrapolate=2,
            fast_compile=smoke,
        ),
    )


def columns(smoke: bool = False) -> tuple[plan.Column, ...]:
    """Every column of the atlas (``smoke``: two small ones, a few steps)."""
    if smoke:
        recall = _level_config("in_context_recall", dict(vocab_size=8, seq_len=16), True)
        return (
            plan.Column("in_context_recall-easy", "mad", recall, SOLVED),
            plan.Column("xor_relation", "expressiveness", _expressiveness("xor_relation", True)),
        )
    found = [plan.Column(t, "expressiveness", _expressiveness(t, False), SOLVED)
             for t in EXPRESSIVENESS]  # fmt: skip
    for task, levels in LEVELS.items():
        family = "regbench" if task == "automaton" else "mad"
        for level, fields in zip(("easy", "hard"), levels, strict=True):
            found.append(plan.Column(f"{task}-{level}", family, _level_config(task, fields, False)))
    return tuple(found)


def _expressiveness(task: str, smoke: bool) -> ExperimentConfig:
    """The task's own config file (its claim's setting) on the atlas's seeds."""
    config = load_file(_CONFIGS / f"{task}.py").get_config("smoke" if smoke else None)
    return with_overrides(config, {"train.seed": FIRST_SEED})


def check_subset(
    smoke: bool, tasks: Sequence[str], scores: Sequence[str]
) -> tuple[plan.Column, ...]:
    """Every column, after checking that ``tasks`` and ``scores`` name columns, tasks and
    scores of the atlas (a ``ValueError`` listing the known names otherwise)."""
    every = columns(smoke)
    known = sorted({c.name for c in every} | {c.name.split("-")[0] for c in every})
    for given, allowed, what in ((tasks, known, "--tasks"), (scores, SCORES, "--scores")):
        if unknown := sorted(set(given) - set(allowed)):
            raise ValueError(f"{what}: unknown {unknown}; expected names of {list(allowed)}")
    return every


def experiments(smoke: bool, tasks: Sequence[str] = (), scores: Sequence[str] = ()) -> list[Any]:
    """Each column's sweep, restricted to the columns whose task or name is in ``tasks`` and
    to ``scores`` (default: all); an unknown name is a ``ValueError`` listing the known."""
    every = check_subset(smoke, tasks, scores)
    chosen = [c for c in every
              if not tasks or c.name in tasks or c.name.split("-")[0] in tasks]  # fmt: skip
    if smoke:  # two scores at one setting, two fixed rates: the code runs, nothing is judged
        return [plan.column_experiment(c, scores or SMOKE_SCORES, (1,), (1,), (3e-3, 1e-2))
                for c in chosen]  # fmt: skip
    return [plan.column_experiment(c, scores or SCORES, (1, 2), (1, 2), RATES) for c in chosen]


# --- The rules ------------------------------------------------------------------------------

Cells = Mapping[tuple[str, str, int, int], plan.Cell]


def _solved(cell: plan.Cell) -> int:
    return cell.stats.solved(SOLVED)


def additive_solves(found: Cells, names: Sequence[str]) -> tuple[str, str]:
    """A1's rule (module docstring) over the columns ``names``, one head."""
    judged, failed, missed = [], [], []
    for name in names:
        for layers in (1, 2):
            cell = {s: found[(name, s, 1, layers)] for s in SCORES}
            if not any(_solved(cell[s]) >= SOLVES for s in MULTIPLICATIVE):
                continue
            judged.append(f"{name} L{layers}")
            if all(_solved(cell[s]) <= FAILS for s in ADDITIVE):
                failed.append(judged[-1])
            elif not any(_solved(cell[s]) >= SOLVES for s in ADDITIVE):
                missed.append(judged[-1])
    reason = (
        f"one head: {len(judged)} (column, layers) solved by a multiplicative score; additive "
        f"fails {len(failed)} ({', '.join(failed) or 'none'}), neither solves nor fails "
        f"{len(missed)} ({', '.join(missed) or 'none'})."
    )
    if failed:
        return "refuted", reason
    return ("supported" if judged and not missed else "inconclusive"), reason


def ties(
    found: Cells, names: Sequence[str], scores: Sequence[str], settings: Sequence[tuple[int, int]]
) -> tuple[str, str]:
    """A2's and A3's rule: each of ``scores`` against scaled_dot at each setting, over the
    columns ``names`` together (TOST ±MARGIN, 95%) and column by column (beyond ±MARGIN at
    ``COLUMN_CONFIDENCE``)."""
    held, apart, beyond, parts = True, [], [], []
    for score in scores:
        for heads, layers in settings:
            pairs = [(found[(n, score, heads, layers)].stats, found[(n, "scaled_dot", heads,
                      layers)].stats) for n in names]  # fmt: skip
            diffs = [a - b for s, r in pairs for a, b in zip(s.values, r.values, strict=True)]
            low, high = st.lower(diffs), st.upper(diffs)
            where = f"{score} H{heads} L{layers}"
            parts.append(f"{where} [{low:+.3f}, {high:+.3f}]")
            held &= -MARGIN < low and high < MARGIN
            if high < -MARGIN or low > MARGIN:
                apart.append(where)
            for name, (s, r) in zip(names, pairs, strict=True):
                if (st.paired_upper(s, r, COLUMN_CONFIDENCE) < -MARGIN
                        or st.paired_lower(s, r, COLUMN_CONFIDENCE) > MARGIN):  # fmt: skip
                    beyond.append(f"{name} {where}")
    reason = (
        f"paired differences from scaled_dot over the columns (one-sided 95% bounds): "
        f"{'; '.join(parts)}; beyond ±{MARGIN} as a whole: {', '.join(apart) or 'none'}; "
        f"single columns beyond ±{MARGIN} at {COLUMN_CONFIDENCE:.0%}: "
        f"{', '.join(beyond) or 'none'}."
    )
    if apart or beyond:
        return "refuted", reason
    return ("supported" if held else "inconclusive"), reason


def verdicts(found: Cells, names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """A1-A3 on a complete atlas (every column of :func:`columns`, every score and setting)."""
    recall = [n for n in names if n.split("-")[0] in RECALL]
    return {
        "A1": additive_solves(found, names),
        "A2": ties(
            found, recall, [s for s in SCORES if s != "scaled_dot"], [(h, 2) for h in (1, 2)]
        ),
        "A3": ties(found, names, ["cosine"], SETTINGS),
    }


# --- Running and reporting ------------------------------------------------------------------


def analyze(
    out: Path,
    smoke: bool,
    *,
    seeds: int | None = None,
    overwrite: bool = False,
    tasks: Sequence[str] = (),
    scores: Sequence[str] = (),
    progress: Any = None,
) -> record.Analysis:
    """Train every column's cells (``tasks``, ``scores``: a subset, which judges nothing),
    resuming what ``out/columns/`` holds; write ``atlas.png``; return the record."""
    seeds = seeds or (1 if smoke else SEEDS)
    seed_range = range(FIRST_SEED, FIRST_SEED + seeds)
    if not smoke and (shared := set(seed_range) & set(PILOT_SEEDS)):
        raise ValueError(f"seeds: the record would use the pilot seeds {sorted(shared)}")
    chosen = experiments(smoke, tasks, scores)
    rows = plan.train_columns(chosen, out, num_seeds=seeds, overwrite=overwrite,
                              progress=progress)  # fmt: skip
    found = plan.cells(chosen, rows)
    names = [e.name for e in chosen]
    used = [s for s in SCORES if any(k[1] == s for k in found)]
    cols = [c for c in columns(smoke) if c.name in names]
    settings = SETTINGS if not smoke else ((1, 1),)
    figure = plan.heatmap_figure(found, cols, used, settings)
    title = "the expressiveness atlas: mean test accuracy and solved seeds per cell"
    save_figure(figure, out / "atlas.png", title, smoke)
    return report_from_rows({"results.csv": rows}, smoke)


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from its ``results.csv`` (a row per column, cell, seed
    and rate): the cell tables, MAD's scores, the costs and the verdicts (a partial atlas, or a
    smoke run, judges nothing: its verdicts say so)."""
    rows = tables["results.csv"]
    names = list(dict.fromkeys(r["column"] for r in rows))
    scores = [s for s in SCORES if any(r["model.score"] == s for r in rows)]
    chosen = experiments(smoke, names, scores)
    found = plan.cells(chosen, rows)
    cols = [c for c in columns(smoke) if c.name in names]
    settings = ((1, 1),) if smoke else SETTINGS
    total = len(columns(smoke)) * len(SCORES) * len(settings)
    if len(found) == total and not smoke:
        judged = verdicts(found, names)
    else:
        why = f"a partial atlas ({len(found)} of {total} cells) judges nothing"
        why = "a smoke run judges nothing" if smoke else why
        judged = {c: ("inconclusive", why) for c in ("A1", "A2", "A3")}
    sections = [
        f"## {h} head{'s' * (h > 1)}, {n} layer{'s' * (n > 1)}\n\n"
        + plan.cell_table(found, cols, scores, (h, n))
        for h, n in settings
    ]
    body = (
        f"# atlas (A1-A3): analysis\n\nTest accuracy at each cell's best rate (mean ± 95% "
        f"interval over {len(next(iter(found.values())).stats.values)} seeds; in parentheses "
        f"the seeds at ≥ {SOLVED:g}).\n\n" + "\n".join(sections)
        + "\n![atlas](atlas.png)\n\n" + _mad_table(found, cols, scores, settings)
        + "\n" + _cost_table(found, cols, settings) + "\n"
        + "".join(f"**Verdict ({c}): {v}.** {r}\n\n" for c, (v, r) in judged.items())
    )  # fmt: skip
    return record.Analysis(rows, body.rstrip() + "\n", judged)


def _mad_table(found: Cells, cols, scores: Sequence[str], settings) -> str:
    """MAD's score (mean test accuracy over the MAD columns) per score and setting, and the
    same on the extrapolation split."""
    mad = [c for c in cols if c.family == "mad"]
    rows = [[s, *(f"{plan.family_scores(found, mad, s, x):.3f} / "
                  f"{plan.family_scores(found, mad, s, x, longer=True):.3f}" for x in settings)]
            for s in scores]  # fmt: skip
    header = ["score", *(f"H{h} L{n}" for h, n in settings)]
    return (
        f"MAD score over {len(mad)} columns: test / extrapolation (twice the length):\n\n"
        + markdown_table(header, rows)
    )


def _cost_table(found: Cells, cols, settings) -> str:
    """Per column and setting: the parameters over scores (least-most) and one run's training
    GFLOPs at scaled_dot."""
    rows = []
    for c in cols:
        row = [c.name]
        for h, n in settings:
            cells = [v for k, v in found.items() if k[0] == c.name and k[2:] == (h, n)]
            params = [v.stats.params for v in cells]
            dot = found.get((c.name, "scaled_dot", h, n))
            flops = f"{dot.train_flops / 1e9:.1f}" if dot else "–"
            row.append(f"{min(params)}-{max(params)}, {flops}" if params else "–")
        rows.append(row)
    header = ["column", *(f"H{h} L{n}: params, GFLOPs" for h, n in settings)]
    return "Parameters (least-most over scores) and training GFLOPs of one run:\n\n" + (
        markdown_table(header, rows)
    )
