"""The expressiveness atlas: every named score on every synthetic task column, with one or two
heads and one or two layers, at matched parameter counts (CLAIMS A1-A3, declared before the
run).

Columns (19). The five expressiveness tasks at their claims' settings, each from its config
file with its model and budget (xor_relation E1, impostor E4, copy E7, mqar E6: 600 steps;
min_of_keys E3: 4000 steps; positions: none for xor_relation, impostor and min_of_keys,
learned for copy, RoPE for mqar as in E6). The 12 MAD columns: MAD's six tasks (Poli et al.
2024: in-context, noisy and fuzzy recall, selective copying, compression, memorization), each
at an easy and a hard level (larger vocabularies, more noise, longer motifs, more tokens to
copy; compression's hard sequence is twice as long). The 2 RegBench columns: an automaton task
(Akyürek et al. 2024) at 4 and 6 states, 64 tokens. These 14 columns share one setting: a
causal transformer with sinusoidal positions added to the embedding, MLP and LayerNorm, width
32, 1000 steps at a constant rate, batch 64, and an extrapolation split at twice the training
length.

The MAD setting's cost, redeclared before any MAD column ran. The first declaration trained
them at width 64 with the hard levels at twice the easy length (64 tokens, automaton 128). One
pilot cell there (in_context_recall-hard, scaled_dot, 2 heads, 2 layers, seeds 100-104, 15
runs) took 489 s of wall time; its test accuracy, mean over seeds per rate, was 0.679 at 1e-3,
0.196 at 3e-3 and 0.192 at 1e-2. Training is compute-bound on 2 cores (about 80 GFLOP/s), so
only fewer FLOPs help: per step of 15 runs at 32 tokens (scaled_dot, 2 heads, 2 layers, beside
another job) width 64 takes 280 ms and width 32 116 ms (2.4x), and each halving of the length
halves it again. Pilot at this setting (seeds 100-102, scaled_dot, 1 head, 2 layers, rates
1e-3, 3e-3, 1e-2, 9 runs per cell; per-seed test accuracy at the rate of the best test mean:
the pilot chose nothing the atlas uses): selective_copying-hard 0.99-1.0 (1e-3),
compression-hard and memorization-hard 1.0 (every rate), automaton-easy 0.86-0.90 (3e-3; its
ceiling lies between 0.80 and 0.92), in_context_recall-easy 1.0, 0.36, 0.35 (1e-3; 1 of 3
seeds; the others below its bag-of-tokens accuracy 0.478), noisy_recall-easy 0.35-0.38 (0 of
3; every rate alike), in_context_recall-hard 0.23-0.25 (1e-3; 0 of 3; the additive score at 1
head, 2 layers the same). At width 64 in_context_recall-easy gave 0 of 3 (0.35-0.36): no
difference detected at 3 seeds. Not piloted: fuzzy_recall (both levels), noisy_recall-hard,
automaton-hard and the easy levels of selective copying, compression and memorization. The
recall columns sit where the induction circuit is found late or not at all in 1000 steps. An
additive cell costs about 2.8x a scaled-dot cell (241 s against 86 s in that pilot: the score
evaluates a tanh on [T, S, A] per head). Estimated from the pilot's cell times (halved for the
job beside it): about 30 min of wall time per column on this machine with both cores, 7-8
hours for the 14 columns, against about 28 hours at the first setting by the same estimate.

Sinusoidal positions, not RoPE: RoPE rotates q and k by their positions before every score,
which the dot family (and cosine, whose norms rotations keep) turn into a function of i − j
alone, while the additive score vᵀtanh(W_qᵀR_i q + W_kᵀR_j k + b) sums two absolute-position
features; RoPE's relative-position property holds for the dot family only, a built-in handicap
for the previous-token and fixed-distance heads these tasks need. Added positions are features
of every score alike. mqar keeps E6's RoPE (its claim's setting): the additive cells there
carry that handicap.

Ceilings. Every column's bar (``Column.solved_at``) is 0.9. fuzzy_recall's scored targets are
determined by their context (an oracle that reads off the value of the key's first pair gets
all 13,678 (easy) and 9,123 (hard) scored positions of 2 × 2000 rows right, keys 0 and 1),
so its ceiling is 1. The automaton's is below the bar: position 0 and every first visit of a
state are scored and no model can know them. Monte Carlo of the generator's process (3000
rows): an oracle that knows the state scores 0.924 (easy) and 0.907 (hard); one that must also
have seen each transition on the string's path, 0.80 and 0.75; the Bayes ceiling lies between
them. Its solved counts are reported against 0.9 and no claim reads them (A1 leaves
the automaton out; A2 and A3 classify its cells by the same bar, below).

Cells. score × heads {1, 2} × layers {1, 2} per column. Matched parameters: each cell's width
is the largest multiple of its column's width step up to the column's width whose model has at
most the parameters of the scaled-dot model at the column's width (+1%, which lets cosine's
per-head scales through): the bilinear and additive scores' extra matrices are paid for with
width, so they never buy capacity (``attnjax.experiment.atlas.matched_width``). The step is 4
for the expressiveness columns (two heads of even size, as RoPE needs; the additive scores get
56-60 of 64 and 24-28 of 32) and 2 for the MAD and automaton columns (sinusoidal positions; the
additive scores get 28-30 of 32, bilinear 30: 89-101% and 92-95% of the scaled-dot model's
parameters, where a step of 4 would leave 84-90% and 80-86%). Rates: every cell starts at 1e-3,
3e-3, 1e-2 and grows by 3× while its best rate (on validation) is at an edge, within 1e-4 to
0.1; accuracy is the test split's at that rate. Seeds 300-304; fresh seeds 305-314 for
confirmation runs (below); pilots: 100-109. A seed *solves* a cell when its test accuracy
reaches the column's bar; a score *solves* a column when ≥ 4 of 5 seeds do.

Claims and rules. Every seed pairs with the same seed at every cell of a column (the same
training data and test draws; initializations differ with the shapes), and cells pair by
seed, not by row order. The claims are judged on the complete atlas only, with exactly 5
seeds per cell (another count: inconclusive, the rules are declared for 5).

A1. One additive head solves, within the column's budget (1000 constant-rate steps for the MAD
columns; the claim config's steps otherwise: 600, 4000 for min_of_keys), every task that one
multiplicative head solves, at matched parameters. A failure reads "not learned in the column's
steps at matched parameters", not "cannot express". Columns: every column but memorization (no
attention is needed: the map lives in the embeddings and MLP, so a failure there would measure
the width rule), the automaton (its ceiling is below the bar) and mqar (it keeps E6's RoPE,
whose relative-position property the additive score lacks, in its control too). At one head,
for each such column and layer count that a multiplicative score (dot, scaled_dot, bilinear)
solves: the additive scores *solve* it if one of them solves it; they *fail* it if each has ≤ 1
of 5 seeds at the bar and a paired one-sided 95% upper bound of (its accuracy − that of the
best solving multiplicative score, by mean) below −0.10; else neither. Supported iff some
(column, layers) is judged and the additive scores solve every one; refuted iff they fail some;
else inconclusive. A cell failed at the matched width has a control, trained after the atlas:
both additive scores at the column's full width on seeds 300-304 (table
``<column>@full_width``). The cell fails only if the control fails too (each additive score ≤ 1
of 5 seeds at the bar); where the control solves or is not yet trained, the cell is neither
(the width rule, not the score, may have failed it). The reason gives each such cell's widths
(additive's against the multiplicative score's) and its control.

A2. On the recall tasks every score ties with scaled_dot at two layers: within ±0.05 of it (so
any two within ±0.1; the additive scores on mqar excepted). Recall columns (7): mqar and both
levels of in-context, noisy and fuzzy recall. At two layers, each head count, each other score
against scaled_dot, paired by seed, except the additive scores on mqar (reported, not judged:
mqar keeps E6's RoPE, whose relative-position property the additive score lacks, above). Per
(score, setting) each column is *floor* (both cells' means ≤ its floor + 0.05), *ceiling*
(every seed of both cells at its bar) or *informative*. A column's floor is the accuracy
reached without recall: for in-context and noisy recall the bag-of-tokens accuracy (the best
order-blind readout; ``BAG_FLOORS``: 0.478 and 0.322 for in-context recall easy and hard, 0.485
and 0.363 for noisy recall), for every other column its chance (a weak floor for fuzzy recall,
whose order-blind accuracy is not computed).
(i) A tie: the mean difference pooled over the informative columns' pairs (column × seed)
within ±0.05 (two one-sided 95% bounds), and every informative column's mean difference within
±0.10; a (score, setting) without an informative column ties (ceiling columns are tied by
declaration).
(ii) A screen: the pooled bound beyond ±0.05 (one-sided 95%) flags the (score, setting), an
informative column's paired bound beyond ±0.05 (one-sided 99%) flags that column. Over 70 such
comparisons at 5 seeds the screen flags something in 8-37% of atlases without any true
difference (below), so a flag calls for confirmation: the flag's two cells (of each of its
columns) are trained again on the fresh seeds 305-314 (table ``<column>@confirm``), and the
flag is confirmed iff the fresh seeds' one-sided 95% bound of the difference (paired; pooled
over the flag's columns) lies beyond ±0.05 on the flag's side.
Supported iff (i) holds at every score and setting and nothing is flagged; refuted iff a flag
is confirmed; else inconclusive, in particular where floor columns are half or more of the
claim's columns at some score and setting (ties at chance) or a flag is not confirmed.
Expected outcome (from the pilot, before the run): inconclusive. Most in-context and noisy
recall cells are likely at their floor, so A2's evidence would rest on mqar, fuzzy recall and
the seeds that found the circuit; refuted stays reachable through a confirmed flag on them.

A3. Cosine with a learnable scale matches scaled_dot: A2's rule, cosine against scaled_dot,
over every column but impostor (18) at every head and layer setting. impostor is reported, not
judged: E4 already establishes the difference there (keys of norm 10 without LayerNorm: dot
and scaled_dot rank keys alike and score about 0.3, cosine 1.0). xor_relation and min_of_keys
stay: cosine's normalization is not bilinear, so a difference there is a finding, not a
built-in.

Power (Monte Carlo of these rules, 300 atlases each: 5 seeds, no true difference, per-seed
differences of spread sd on every informative column; recomputed by
tests/experiment/test_atlas_power.py): A2 comes out supported in 99%, 2% and 0% of atlases at
sd 0.05, 0.1 and 0.15, A3 in 100%, 14% and 0%; so A2 and A3 can be supported essentially only
where the scores saturate together or differ by a few points per seed. The screen flags
something (and calls for confirmation runs) in 8%, 21% and 33% (A2) and 11%, 24% and 37% (A3)
of atlases at sd 0.1, 0.15 and 0.2, and in 31% and 18% where each score solves each seed with
probability 1/2; a flag without a true difference is confirmed with probability below 5%.

Reported, not judged: MAD's score per score and setting (mean test accuracy over the 12 MAD
columns), the same on the extrapolation split, parameters and training FLOPs per cell. The
confirmation runs' and the controls' tables are reported and read by A2, A3 and A1.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

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
from attnjax.experiment.report import fmt, markdown_table, save_figure
from attnjax.experiment.sweep import Stats

_CONFIGS = Path(__file__).parents[1] / "configs"
COMMITTED = Path(__file__).parents[1] / "results" / "atlas" / "columns"  # finished columns' tables
SCORES = ("dot", "scaled_dot", "bilinear", "additive", "additive_relu", "cosine")
SMOKE_SCORES = ("scaled_dot", "additive")
MULTIPLICATIVE, ADDITIVE = ("dot", "scaled_dot", "bilinear"), ("additive", "additive_relu")
SETTINGS = ((1, 1), (1, 2), (2, 1), (2, 2))  # (heads, layers)
RATES = AutoRates((1e-3, 3e-3, 1e-2), factor=3.0, bounds=(1e-4, 0.1))
SEEDS, FIRST_SEED, PILOT_SEEDS = 5, 300, tuple(range(100, 110))
SOLVED, SOLVES, FAILS = 0.9, 4, 1  # every column's bar; seeds of 5 that solve / fail a column
GAP = 0.10  # A1: a failing additive score lies this far below the solving one (paired bound)
MARGIN, COLUMN_CONFIDENCE = 0.05, 0.99
CONFIRM_FIRST_SEED, CONFIRM_SEEDS = 305, 10  # a flag's fresh seeds: 305-314
CONFIRM, CONTROL = "@confirm", "@full_width"  # the tables of confirmation runs and A1's controls
RECALL = ("mqar", "in_context_recall", "noisy_recall", "fuzzy_recall")
# A2's and A3's floor where order-blind statistics beat chance: the bag-of-tokens accuracy
# (attnjax.tasks.recall.bag_of_tokens_accuracy, 2000 draws of key 0), declared before the run.
BAG_FLOORS = {"in_context_recall-easy": 0.478, "in_context_recall-hard": 0.322,
              "noisy_recall-easy": 0.485, "noisy_recall-hard": 0.363}  # fmt: skip
ROPE_HANDICAP = {("mqar", s) for s in ("additive", "additive_relu")}  # not judged by A2
NOT_IN_A1, NOT_IN_A3 = ("memorization", "automaton", "mqar"), ("impostor",)
AUDIT_KEYS = ("column", "model.width", "params", "flops_per_step", "train_flops", "wall_s",
              "cpu_s", "compile_s")  # fmt: skip
MAD_WIDTH, MAD_WIDTH_STEP = 32, 2  # the MAD and automaton columns' width and width step
# The MAD and automaton tasks at their two levels: the task's config fields per level.
LEVELS = {
    "in_context_recall": (dict(vocab_size=16, seq_len=32), dict(vocab_size=32, seq_len=32)),
    "noisy_recall": (
        dict(vocab_size=24, noise_vocab_size=8, frac_noise=0.2, seq_len=32),
        dict(vocab_size=40, noise_vocab_size=8, frac_noise=0.4, seq_len=32),
    ),
    "fuzzy_recall": (
        dict(vocab_size=17, seq_len=32, key_size=2, value_size=2),
        dict(vocab_size=33, seq_len=32, key_size=3, value_size=3),
    ),
    "selective_copying": (
        dict(vocab_size=16, seq_len=32, num_tokens=4),
        dict(vocab_size=16, seq_len=32, num_tokens=8),
    ),
    "compression": (dict(vocab_size=16, seq_len=16), dict(vocab_size=16, seq_len=32)),
    "memorization": (dict(vocab_size=64, seq_len=32), dict(vocab_size=256, seq_len=32)),
    "automaton": (dict(num_states=4, seq_len=64), dict(num_states=6, seq_len=64)),
}
EXPRESSIVENESS = ("xor_relation", "impostor", "copy", "mqar", "min_of_keys")


def _level_config(task: str, fields: Mapping[str, Any], smoke: bool) -> ExperimentConfig:
    return ExperimentConfig(
        name=task,
        task=registry.get(task).config(**fields),
        model=dict(
            kind="transformer",
            width=MAD_WIDTH,
            layers=1,
            heads=1,
            positional="sinusoidal",
            causal=True,
        ),
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
            config = _level_config(task, fields, False)
            found.append(plan.Column(f"{task}-{level}", family, config, SOLVED, MAD_WIDTH_STEP))
    return tuple(found)


def _expressiveness(task: str, smoke: bool) -> ExperimentConfig:
    """The task's own config file (its claim's setting) on the atlas's seeds."""
    config = load_file(_CONFIGS / f"{task}.py").get_config("smoke" if smoke else None)
    return with_overrides(config, {"train.seed": FIRST_SEED})


def _task(column: plan.Column) -> str:
    """The task of a column (``"in_context_recall"`` of ``"in_context_recall-hard"``)."""
    return column.name.split("-")[0]


def check_subset(
    smoke: bool, tasks: Sequence[str], scores: Sequence[str]
) -> tuple[plan.Column, ...]:
    """Every column, after checking that ``tasks`` and ``scores`` name columns, tasks and
    scores of the atlas (a ``ValueError`` listing the known names otherwise)."""
    every = columns(smoke)
    known = sorted({c.name for c in every} | {_task(c) for c in every})
    for given, allowed, what in ((tasks, known, "--tasks"), (scores, SCORES, "--scores")):
        if unknown := sorted(set(given) - set(allowed)):
            raise ValueError(f"{what}: unknown {unknown}; expected names of {list(allowed)}")
    return every


def experiments(smoke: bool, tasks: Sequence[str] = (), scores: Sequence[str] = ()) -> list[Any]:
    """Each column's sweep, restricted to the columns whose task or name is in ``tasks`` and
    to ``scores`` (default: all); an unknown name is a ``ValueError`` listing the known."""
    every = check_subset(smoke, tasks, scores)
    chosen = [c for c in every
              if not tasks or c.name in tasks or _task(c) in tasks]  # fmt: skip
    if smoke:  # two scores at one setting, two fixed rates: the code runs, nothing is judged
        return [plan.column_experiment(c, scores or SMOKE_SCORES, (1,), (1,), (3e-3, 1e-2))
                for c in chosen]  # fmt: skip
    return [plan.column_experiment(c, scores or SCORES, (1, 2), (1, 2), RATES) for c in chosen]


# --- The rules ------------------------------------------------------------------------------

Cells = Mapping[tuple[str, str, int, int], plan.Cell]


def _solved(cell: plan.Cell, column: plan.Column) -> int:
    return cell.stats.solved(column.solved_at)


def _a1_outcome(found: Cells, column: plan.Column, layers: int) -> tuple[str, str] | None:
    """A1 on one (column, layers) at one head: ``("solved" | "failed" | "neither", widths)``,
    None where no multiplicative score solves it."""
    cell = {s: found[(column.name, s, 1, layers)] for s in SCORES}
    solving = [s for s in MULTIPLICATIVE if _solved(cell[s], column) >= SOLVES]
    if not solving:
        return None
    best = max(solving, key=lambda s: cell[s].stats.mean)
    widths = ", ".join(f"{s} {cell[s].width}" for s in ADDITIVE)
    widths = f"width {widths} vs {best} {cell[best].width}"
    if any(_solved(cell[s], column) >= SOLVES for s in ADDITIVE):
        return "solved", widths
    far = [st.paired_upper(cell[s].stats, cell[best].stats) < -GAP for s in ADDITIVE]
    if all(_solved(cell[s], column) <= FAILS for s in ADDITIVE) and all(far):
        return "failed", widths
    return "neither", widths


def _a1_columns(cols: Sequence[plan.Column]) -> list[plan.Column]:
    return [c for c in cols if _task(c) not in NOT_IN_A1]


def additive_solves(found: Cells, cols: Sequence[plan.Column]) -> tuple[str, str]:
    """A1's rule (module docstring) over the columns ``cols``, one head: a cell failed at the
    matched width fails only if its control (``<column>@full_width``) fails too."""
    judged, failed, missed = [], [], []
    for column in cols:
        for layers in (1, 2):
            if (outcome := _a1_outcome(found, column, layers)) is None:
                continue
            where = f"{column.name} L{layers}"
            judged.append(where)
            if outcome[0] == "failed":
                control, held = _control(found, column, layers)
                (failed if held else missed).append(f"{where} ({outcome[1]}; {control})")
            elif outcome[0] == "neither":
                missed.append(where)
    reason = (
        f"one head: {len(judged)} (column, layers) solved by a multiplicative score; additive "
        f"fails {len(failed)} ({'; '.join(failed) or 'none'}), neither solves nor fails "
        f"{len(missed)} ({'; '.join(missed) or 'none'})."
    )
    if failed:
        return "refuted", reason
    return ("supported" if judged and not missed else "inconclusive"), reason


def _control(found: Cells, column: plan.Column, layers: int) -> tuple[str, bool]:
    """The full-width control of a cell failed at the matched width: each additive score's
    solved seeds, and whether it fails too (each ≤ ``FAILS`` of 5; False while untrained)."""
    cells = [found.get((column.name + CONTROL, s, 1, layers)) for s in ADDITIVE]
    if None in cells:
        return "full-width control not trained", False
    solved = ", ".join(f"{s} {c.seeds_at(column.solved_at)}"
                       for s, c in zip(ADDITIVE, cells, strict=True))  # fmt: skip
    held = all(_solved(c, column) <= FAILS for c in cells)
    return f"at full width {cells[0].width}: {solved} solved", held


class Flag(NamedTuple):
    """A screen's flag: the columns whose ``score`` and scaled_dot cells at ``setting`` differ
    beyond ±MARGIN on ``side`` (+1 above, −1 below), pooled (several columns) or alone."""

    columns: tuple[str, ...]
    score: str
    setting: tuple[int, int]
    side: int

    def __str__(self) -> str:
        where = "pooled" if len(self.columns) > 1 else self.columns[0]
        side = "above" if self.side > 0 else "below"
        return f"{where} {self.score} H{self.setting[0]} L{self.setting[1]} {side}"


def floor(column: plan.Column) -> float:
    """The accuracy below which a column's cells count as unlearned: its bag-of-tokens
    accuracy where declared (``BAG_FLOORS``), else its chance."""
    return BAG_FLOORS.get(column.name, column.base.task.spec.chance_accuracy)


def _kind(column: plan.Column, pair: Sequence[Stats]) -> str:
    """``"floor"``, ``"ceiling"`` or ``"informative"`` (module docstring, A2)."""
    if all(s.mean <= floor(column) + MARGIN for s in pair):
        return "floor"
    if all(v >= column.solved_at for s in pair for v in s.values):
        return "ceiling"
    return "informative"


def _differences(pairs: Sequence[Sequence[Stats]]) -> list[float]:
    """Per-seed differences ``a − b`` of each pair, pooled."""
    return [x - y for a, b in pairs for x, y in zip(a.values, b.values, strict=True)]


def _beyond(low: float, high: float) -> int:
    """+1 / −1 where the bounds ``[low, high]`` lie beyond +MARGIN / −MARGIN, else 0."""
    return 1 if low > MARGIN else -1 if high < -MARGIN else 0


def _compare(
    found: Cells, cols: Sequence[plan.Column], score: str, setting: tuple[int, int]
) -> tuple[str, bool, bool, list[Flag]]:
    """One (score, setting) of A2's rule: its summary for the reason, whether it ties (i),
    whether its floor columns are half or more, and the screen's flags (ii). Columns where the
    score carries RoPE's handicap (``ROPE_HANDICAP``) are left out."""
    cols = [c for c in cols if (_task(c), score) not in ROPE_HANDICAP]
    pairs = {c.name: [found[(c.name, s, *setting)].stats for s in (score, "scaled_dot")]
             for c in cols}  # fmt: skip
    kinds = [_kind(c, pairs[c.name]) for c in cols]
    informative = [c.name for c, k in zip(cols, kinds, strict=True) if k == "informative"]
    counts = [kinds.count(k) for k in ("informative", "ceiling", "floor")]
    at_chance = 2 * counts[2] >= len(cols)
    summary = f"{score} H{setting[0]} L{setting[1]}: {counts[0]}/{counts[1]}/{counts[2]}"
    if not informative:
        return summary, True, at_chance, []
    diffs = _differences([pairs[n] for n in informative])
    low, high = st.lower(diffs), st.upper(diffs)
    close = all(abs(pairs[n][0].mean - pairs[n][1].mean) <= 2 * MARGIN for n in informative)
    flags = [Flag(tuple(informative), score, setting, side)
             for side in [_beyond(low, high)] if side]  # fmt: skip
    for n in informative:
        a, b = pairs[n]
        side = _beyond(st.paired_lower(a, b, COLUMN_CONFIDENCE),
                       st.paired_upper(a, b, COLUMN_CONFIDENCE))  # fmt: skip
        flags += [Flag((n,), score, setting, side)] if side else []
    held = -MARGIN < low and high < MARGIN and close
    return f"{summary} [{low:+.3f}, {high:+.3f}]", held, at_chance, flags


def _confirmed(found: Cells, flag: Flag) -> bool | None:
    """Whether the fresh seeds confirm ``flag`` (their pooled one-sided 95% bound beyond
    ±MARGIN on its side); None where they are not all trained."""
    cells = [[found.get((n + CONFIRM, s, *flag.setting)) for s in (flag.score, "scaled_dot")]
             for n in flag.columns]  # fmt: skip
    if any(c is None for pair in cells for c in pair):
        return None
    diffs = _differences([(a.stats, b.stats) for a, b in cells])
    return _beyond(st.lower(diffs), st.upper(diffs)) == flag.side


def flags(
    found: Cells, cols: Sequence[plan.Column], scores: Sequence[str], settings: Sequence[tuple]
) -> list[Flag]:
    """The screen's flags of A2's rule over ``cols``, ``scores`` and ``settings``."""
    return [f for s in scores for x in settings for f in _compare(found, cols, s, x)[3]]


def ties(
    found: Cells, cols: Sequence[plan.Column], scores: Sequence[str], settings: Sequence[tuple]
) -> tuple[str, str]:
    """A2's and A3's rule (module docstring): each of ``scores`` against scaled_dot at each
    setting over the columns ``cols``; flags confirmed by the ``<column>@confirm`` cells."""
    parts, held, at_chance, flagged = [], True, [], []
    for score in scores:
        for setting in settings:
            summary, tie, chance, found_flags = _compare(found, cols, score, setting)
            parts.append(summary)
            held &= tie
            at_chance += [f"{score} H{setting[0]} L{setting[1]}"] if chance else []
            flagged += found_flags
    outcome = {f: _confirmed(found, f) for f in dict.fromkeys(flagged)}
    confirmed = [str(f) for f, c in outcome.items() if c]
    open_ = [f"{f} ({'not retrained' if c is None else 'not confirmed'})"
             for f, c in outcome.items() if not c]  # fmt: skip
    reason = (
        f"against scaled_dot, columns informative/ceiling/floor and the pooled one-sided 95% "
        f"bounds of the informative ones: {'; '.join(parts)}; at chance (floor ≥ half): "
        f"{', '.join(at_chance) or 'none'}; flagged beyond ±{MARGIN} (pooled 95%, a column "
        f"{COLUMN_CONFIDENCE:.0%}): {len(outcome)}, confirmed on seeds {CONFIRM_FIRST_SEED}-"
        f"{CONFIRM_FIRST_SEED + CONFIRM_SEEDS - 1}: {', '.join(confirmed) or 'none'}; "
        f"open: {', '.join(open_) or 'none'}."
    )
    if confirmed:
        return "refuted", reason
    return ("supported" if held and not at_chance and not flagged else "inconclusive"), reason


def _claims(cols: Sequence[plan.Column]) -> dict[str, tuple]:
    """A2's and A3's columns, scores and settings."""
    recall = [c for c in cols if _task(c) in RECALL]
    return {
        "A2": (recall, [s for s in SCORES if s != "scaled_dot"], [(h, 2) for h in (1, 2)]),
        "A3": ([c for c in cols if _task(c) not in NOT_IN_A3], ["cosine"], SETTINGS),
    }


def verdicts(found: Cells, cols: Sequence[plan.Column]) -> dict[str, tuple[str, str]]:
    """A1-A3 on a complete atlas (every column of :func:`columns`, every score and setting,
    with whatever confirmation runs and controls ``found`` holds)."""
    return {"A1": additive_solves(found, _a1_columns(cols))} | {
        claim: ties(found, *args) for claim, args in _claims(cols).items()
    }


class Followup(NamedTuple):
    """Cells trained after the atlas: a flag's confirmation or a failed cell's control."""

    column: plan.Column
    cells: tuple[tuple[str, int, int], ...]
    matched: bool  # at the matched width (confirmation) or the column's (control)
    seeds: int

    def experiment(self) -> Any:
        return plan.cell_experiment(self.column, self.cells, RATES, matched=self.matched)


def followups(found: Cells, cols: Sequence[plan.Column]) -> list[Followup]:
    """The confirmation runs of every flag of A2 and A3 and the controls of A1's failed
    cells that the complete atlas ``found`` calls for."""
    confirm: dict[str, set] = {}
    for args in _claims(cols).values():
        for flag in flags(found, *args):
            for name in flag.columns:
                cells = confirm.setdefault(name, set())
                cells.update((s, *flag.setting) for s in (flag.score, "scaled_dot"))
    control: dict[str, set] = {}
    for column in _a1_columns(cols):
        for layers in (1, 2):
            if (outcome := _a1_outcome(found, column, layers)) and outcome[0] == "failed":
                control.setdefault(column.name, set()).update((s, 1, layers) for s in ADDITIVE)
    chosen = []
    for c in cols:
        if c.name in confirm:
            base = with_overrides(c.base, {"train.seed": CONFIRM_FIRST_SEED})
            named = c._replace(name=c.name + CONFIRM, base=base)
            chosen.append(Followup(named, _ordered(confirm[c.name]), True, CONFIRM_SEEDS))
        if c.name in control:
            named = c._replace(name=c.name + CONTROL)
            chosen.append(Followup(named, _ordered(control[c.name]), False, SEEDS))
    return chosen


def _ordered(cells: set) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted(cells, key=lambda c: (SCORES.index(c[0]), *c[1:])))


def _followup_cells(chosen: Sequence[Followup], rows: Sequence[Mapping]) -> dict:
    """The cells of the follow-ups that ``rows`` hold on their declared seeds (rows of a cell
    no follow-up calls for are ignored)."""
    found = {}
    for f in chosen:
        own = [r for r in rows if r["column"] == f.column.name]
        have = tuple(c for c in f.cells if any(_cell_of(r) == c for r in own))
        if have:
            cells = plan.cells([f._replace(cells=have).experiment()],
                               [r for r in own if _cell_of(r) in have])  # fmt: skip
            found |= {k: v for k, v in cells.items() if len(v.stats.values) == f.seeds}
    return found


def _cell_of(row: Mapping) -> tuple[str, int, int]:
    return row["model.score"], row["model.heads"], row["model.layers"]


def _unjudged(found: Cells, smoke: bool) -> str | None:
    """Why the atlas ``found`` judges nothing (a smoke run, a partial atlas, another seed
    count than the rules'), None for a complete atlas."""
    if smoke:
        return "a smoke run judges nothing"
    total = len(columns()) * len(SCORES) * len(SETTINGS)
    counts = sorted({len(c.stats.values) for c in found.values()})
    if len(found) != total:
        return f"a partial atlas ({len(found)} of {total} cells) judges nothing"
    if counts != [SEEDS]:
        return (f"cells of {'/'.join(map(str, counts))} seeds judge nothing: the rules are "
                f"declared for {SEEDS}")  # fmt: skip
    return None


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
    resuming what ``out/columns/`` holds, then on a complete atlas the confirmation runs and
    controls its rules call for (:func:`followups`); write ``atlas.png``; return the record."""
    seeds = seeds or (1 if smoke else SEEDS)
    seed_range = range(FIRST_SEED, FIRST_SEED + seeds)
    if not smoke and (shared := set(seed_range) & set(PILOT_SEEDS)):
        raise ValueError(f"seeds: the record would use the pilot seeds {sorted(shared)}")
    chosen = experiments(smoke, tasks, scores)
    rows = plan.train_columns(chosen, out, num_seeds=seeds, overwrite=overwrite,
                              progress=progress, finished=None if smoke else COMMITTED)  # fmt: skip
    found = plan.cells(chosen, rows)
    names = [e.name for e in chosen]
    used = [s for s in SCORES if any(k[1] == s for k in found)]
    cols = [c for c in columns(smoke) if c.name in names]
    if _unjudged(found, smoke) is None:  # the flags' confirmations and A1's controls
        for f in followups(found, cols):
            rows += plan.train_columns([f.experiment()], out, num_seeds=f.seeds,
                                       overwrite=overwrite, progress=progress,
                                       finished=COMMITTED)  # fmt: skip
    settings = SETTINGS if not smoke else ((1, 1),)
    figure = plan.heatmap_figure(found, cols, used, settings)
    title = "the expressiveness atlas: mean test accuracy and solved seeds per cell"
    save_figure(figure, out / "atlas.png", title, smoke)
    return report_from_rows({"results.csv": rows}, smoke)


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from its ``results.csv`` (a row per column, cell, seed
    and rate; the follow-ups' columns named ``<column>@confirm`` and ``<column>@full_width``):
    the cell tables, MAD's scores, the costs, the follow-ups and the verdicts (a partial atlas,
    a smoke run or another seed count judges nothing: its verdicts say so)."""
    rows = tables["results.csv"]
    main = [r for r in rows if "@" not in r["column"]]
    names = list(dict.fromkeys(r["column"] for r in main))
    scores = [s for s in SCORES if any(r["model.score"] == s for r in main)]
    found = plan.cells(experiments(smoke, names, scores), main)
    cols = [c for c in columns(smoke) if c.name in names]
    settings = ((1, 1),) if smoke else SETTINGS
    extra: dict = {}
    if (why := _unjudged(found, smoke)) is None:
        extra = _followup_cells(followups(found, cols), rows)
        judged = verdicts({**found, **extra}, cols)
    else:
        judged = {c: ("inconclusive", why) for c in ("A1", "A2", "A3")}
    sections = [
        f"## {h} head{'s' * (h > 1)}, {n} layer{'s' * (n > 1)}\n\n"
        + plan.cell_table(found, cols, scores, (h, n))
        for h, n in settings
    ]
    body = (
        f"# atlas (A1-A3): analysis\n\nTest accuracy at each cell's best rate (mean ± 95% "
        f"interval over {len(next(iter(found.values())).stats.values)} seeds; in parentheses "
        f"the seeds at ≥ {SOLVED:g}, every column's bar).\n\n" + "\n".join(sections)
        + "\n![atlas](atlas.png)\n\n"
        + "\n".join(t for t in (_mad_table(found, cols, scores, settings),
                                _cost_table(found, cols, settings), _time_table(rows),
                                _followup_table(extra, cols)) if t)
        + "\n" + "".join(f"**Verdict ({c}): {v}.** {r}\n\n" for c, (v, r) in judged.items())
    )  # fmt: skip
    return record.Analysis(rows, body.rstrip() + "\n", judged)


def _mad_table(found: Cells, cols, scores: Sequence[str], settings) -> str:
    """MAD's score (mean test accuracy over the MAD columns) per score and setting, and the
    same on the extrapolation split; nothing without a MAD column."""
    mad = [c for c in cols if c.family == "mad"]
    if not mad:
        return ""
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


def _time_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Each trained table's time, as measured around the calls that trained it
    (:func:`attnjax.experiment.atlas.timed`; a table trained in parts sums its calls, each
    told by its cost): wall and CPU minutes, the share of the wall time during which JAX was
    compiling and what the time covers; and the total."""
    calls: dict[str, dict[tuple, Any]] = {}
    for r in rows:
        calls.setdefault(r["column"], {})[(r["wall_s"], r["cpu_s"], r["compile_s"])] = r.get(
            "resumed"
        )
    cost = {n: tuple(sum(c[i] for c in own) for i in range(3)) for n, own in calls.items()}
    covers = {n: _covers(list(own.values())) for n, own in calls.items()}
    total = tuple(sum(c[i] for c in cost.values()) for i in range(3))
    partial = any(v != _COVERS[0] for v in covers.values())
    covers["total"] = "at least (some tables' time may be partial)" if partial else _COVERS[0]
    lines = [[n, f"{w / 60:.1f}", f"{c / 60:.1f}", f"{k / w:.0%}", covers[n]]
             for n, (w, c, k) in [*cost.items(), ("total", total)]]  # fmt: skip
    header = ["table", "wall min", "CPU min", "compiling, share of wall", "covers"]
    return "Time (2-core CPU unless env.json says otherwise):\n\n" + markdown_table(header, lines)


def _covers(resumed: Sequence[Any]) -> str:
    """What the time of a table's calls covers, by their ``resumed`` values."""
    worst = max(resumed, key=lambda r: (r is None, r or 0))
    text = _COVERS.get(worst, "not recorded")
    return text if len(resumed) == 1 else f"{text}, in {len(resumed)} calls"


# What a table's time covers, by its ``resumed`` value (missing in tables written before it).
_COVERS = {0: "the whole training", 1: "the last call only (resumed)"}


def _followup_table(extra: Cells, cols: Sequence[plan.Column]) -> str:
    """The confirmation runs and controls trained (none: nothing)."""
    if not extra:
        return ""
    bar = {c.name: c.solved_at for c in cols}
    rows = [[name, score, f"H{h} L{n}", str(c.width), fmt(c.stats.mean, c.stats.half_width),
             c.seeds_at(bar[name.split("@")[0]])]
            for (name, score, h, n), c in extra.items()]  # fmt: skip
    header = ["column", "score", "setting", "width", "test accuracy", "solved"]
    return (
        f"Confirmation runs (seeds {CONFIRM_FIRST_SEED}-{CONFIRM_FIRST_SEED + CONFIRM_SEEDS - 1}) "
        f"and full-width controls (seeds {FIRST_SEED}-{FIRST_SEED + SEEDS - 1}):\n\n"
        + markdown_table(header, rows)
        + "\n"
    )
