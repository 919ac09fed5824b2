"""CLAIMS S8: additive attention vᵀ act(W_q q + W_k k + b) without a bias receives symmetric
inputs that cancel, giving near-uniform attention at initialization; a bias keeps tanh in its
active range; with ReLU instead of tanh some hidden units are dead (never positive, for every
input), and a positive bias helps.

Model: Bahdanau-style retrieval (the query vector over 8 key vectors, the impostor task's
inputs without its norm cue, D = 8), an additive score with A = 32 hidden units whose ``b`` is
the only learnable bias before the softmax, a linear readout of the weighted values. Declared
before any full run of this design (issue 24's redesign of S8); per seed (record seeds 10–25,
shared by every point: the same initial W_q, W_k, v, readout and data, only the bias
differs), one-sided 95% bounds over seeds (``attnjax.experiment.stats``), paired where points
share seeds. The claim is judged on (b) and (c): supported iff both are, refuted iff either
is, else inconclusive.

* **Cancellation: not judged** (Checks and a report). The source's "*can*, at initialization,
  receive symmetric inputs that cancel" is the mirror identity (Check: the bias-free score
  negates on (−q, −K)); exact cancellation of a unit's input, W_qᵀq + W_kᵀk = 0, has no
  non-zero solution here (32 hidden units on 16 input dimensions). Near-uniform attention at
  initialization is decided by the weights' scale, not by cancellation: with the same weights
  and v × 10 the bias-free score is far from uniform. So it is a Check (initialization fact:
  entropy / log S ≥ ``UNIFORM`` (0.9) at init, below it with v × 10), never counted; the
  report gives the per-seed init entropy with its bounds, the same weights with ``b = +1``,
  and the v × 10 control for both (paired bounds). No trained point on centred tanh inputs:
  the bias-free score is odd, so it provably ranks the match first on at most one of an
  example and its mirror; "a learnable bias fixes it" is that theorem, not judged.
* **(b) an explicit learnable bias keeps tanh active, against none** (does; centred inputs):
  both points start with the same off-centre pre-activations, per unit the constant
  c = ``OFFSET`` · (W_q + W_k)ᵀ1 of the initial weights (what inputs offset by 3 would add).
  Without a bias c is frozen (not trained; on centred inputs the weights cannot move the
  pre-activations' mean); with a bias, b is learnable and starts at c. The trained saturated
  fraction (|pre-activation| > 2) without minus with the bias, per seed: *supported* iff its
  paired lower bound > ``EFFECT`` (0.05); *refuted* iff its paired upper bound < ``EFFECT``
  (the reduction is shown smaller than the declared effect: the relevant side of an
  equivalence test at ±0.05; the report says whether the two-sided TOST also holds); else
  inconclusive.
* **(c) ReLU: a positive bias leaves fewer dead units** (does; inputs offset by 3): a unit is
  *dead* when its pre-activation is ≤ 0 for every (query, key) of the seed's test batch
  (2048 × 8 pairs). (c2) dead fraction without a bias minus with a learnable bias from +1,
  trained, paired: holds iff lower bound > ``EFFECT``, contradicted iff upper bound <
  ``EFFECT``; (c3) accuracy not lost (the design's guard, not in the source's claim): +1 minus
  no bias, paired: holds iff lower bound > −``ACCURACY_MARGIN`` (0.02), contradicted iff upper
  bound < −``ACCURACY_MARGIN``. (c) is supported iff both hold, refuted iff either is
  contradicted. That dead units exist is a Check, not judged (initialization fact and theorem:
  on offset inputs some bias-free units are dead at init, and a dead unit's parameters get no
  gradient, so they stay dead); its trained value is reported. Also Checks: at init a unit
  dead with b = +1 is dead with b = 0 (identity: the init gap of (c2) is built in; it is
  reported with its paired bounds beside the trained gap, which is judged because rescued
  units can die in training); on centred inputs no bias-free unit is dead (theorem: why (c)
  uses offset inputs).

Rates: each trained point's grid is ``AutoRates`` from 0.003–0.03, ×3, bounds 3e-4–0.3 (the
lowest rate it can reach is 0.000333), its best rate chosen on validation loss (no ties). The
two points of a part are judged at one rate: their common best rate, or, when they chose
different rates, the rate of their shared grid with the smallest sum of the two points' mean
validation losses (the report says whether they agreed). A refutation of a part stands only if
that rate is interior to both of its points' grids; otherwise the part is inconclusive.
Pilot seeds: 0–4 (the earlier records) and 100–117 (this design's two pilots, on the earlier
form of (b) with offset inputs); the record refuses them. 16 seeds: the first pilot's paired
spreads (0.03 for (c3), 0.04 for (c2); 2 seeds, 1 df: rough) give power ≈ 0.75 to clear the
(c3) margin; the second pilot's bimodal ReLU losses make (c3), and so (c), likely
inconclusive. (b)'s frozen-offset form was not piloted. Declared fallback: if the 16-seed run
cannot finish in its time budget, the record is 12 seeds (10–21) under the same rule."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from attnjax import analysis, nn, tasks
from attnjax.experiment import (
    AutoRates,
    Check,
    Experiment,
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    combine,
    label,
    load_run,
    record,
    sweep,
)
from attnjax.experiment.config import with_overrides
from attnjax.experiment.parts import checks_text, run_checks
from attnjax.experiment.recompute import Differs
from attnjax.experiment.report import fmt, markdown_table, mean_ci95, new_figure, save_figure
from attnjax.experiment.stats import equivalent, lower, paired_lower, paired_upper, upper
from attnjax.experiment.sweep import Stats, summarize, sweep_tables
from attnjax.experiment.trainer import INIT, get_trainer
from attnjax.nn.config import register
from attnjax.nn.scores import make_score

SEEDS, FIRST_SEED = 16, 10  # record seeds 10-25
PILOT_SEEDS = (0, 1, 2, 3, 4, *range(100, 118))  # the earlier records'; this design's pilots
DIM, NUM_KEYS, HIDDEN = 8, 8, 32
OFFSET = 3.0  # (c): added to every input; (b): the frozen or initial constant it would give
PLUS = 1.0  # the positive bias's initial value (ReLU)
RATES = AutoRates((3e-3, 1e-2, 3e-2), factor=3.0, bounds=(3e-4, 0.3))
UNIFORM = 0.9  # the init Check: entropy / log S near uniform at or above
SCALE = 10.0  # the init scale control: the same weights with v × SCALE
EFFECT = 0.05  # (b), (c2): the declared effect on a saturated or dead fraction
ACCURACY_MARGIN = 0.02  # (c3): accuracy not lost by more than this
AUDIT_KEYS = ("best rate",)  # audit: a chosen rate identifies a row, as learning_rate
STATS = ("entropy / log S", "saturated", "dead per query", "dead for every input")
SCALED = f"entropy / log S, v × {SCALE:g}"  # reported at initialization only
SHIFTED = "additive_retrieval_shifted"


def _point(score: str, bias: float | None, offset: float, kind: str = "additive_retrieval"):
    """Overrides of one point: ``bias`` None (no b) or b's initial value (learnable)."""
    fields = {"model.kind": kind, "model.score": score, "model.score_bias": bias is not None}
    return fields | {"model.score_bias_init": bias or 0.0, "task.offset": offset}


CENTRED_NONE = _point("additive", None, 0.0)  # the init Check and report
CENTRED_PLUS = _point("additive", 1.0, 0.0)  # reported: the same weights with b = +1
RELU_CENTRED = _point("additive_relu", None, 0.0)  # the centred-input check of (c)
TANH_NONE = _point("additive", None, 0.0, SHIFTED)  # (b): frozen offset c
TANH_BIAS = _point("additive", 0.0, 0.0, SHIFTED)  # (b): learnable b from c
RELU_NONE, RELU_PLUS = _point("additive_relu", None, OFFSET), _point("additive_relu", PLUS, OFFSET)
TRAINED = (TANH_NONE, TANH_BIAS, RELU_NONE, RELU_PLUS)
AT_INIT = (CENTRED_NONE, CENTRED_PLUS, RELU_CENTRED)
POINTS = (*AT_INIT, *TRAINED)
B, C = "(b) explicit bias keeps tanh active", "(c) ReLU: +1 leaves fewer dead units"
PAIRS = {B: (TANH_NONE, TANH_BIAS), C: (RELU_NONE, RELU_PLUS)}


def preactivations(p: dict, q: Array, k: Array) -> Float[Array, "B 1 S A"]:
    """``W_qᵀ q + W_kᵀ k + b + shift`` of ``q [B, 1, 1, D]`` against ``k [B, 1, S, D]``, with
    ``b`` and the frozen ``shift [1, A]`` where ``p`` has them."""
    pre = q @ p["w_q"] + k @ p["w_k"]
    for name in ("b", "shift"):
        if name in p:
            pre = pre + jax.lax.broadcast_to_rank(p[name], pre.ndim)
    return pre


@register("additive_retrieval")
class AdditiveRetrieval(nnx.Module):
    """Bahdanau-style retrieval on the impostor task's tokens ``[B, S + 1, D + 1 + V]``: the
    last token's vector ``q [B, 1, 1, D]`` attends over the keys' vectors ``k [B, 1, S, D]``
    with the config's additive score (its ``b`` the only learnable bias before the softmax),
    and a linear readout maps the weighted mixture of the keys' one-hot values ``[B, V]`` to
    logits, repeated at every position (the task scores the last)."""

    def __init__(self, config: nn.ModelConfig, *, rngs: nnx.Rngs):
        self.dim = config.in_features - 1 - config.num_classes
        self.score = make_score(config.score, 1, self.dim, options=config.score_options(),
                                rngs=rngs)  # fmt: skip
        self.readout = nnx.Linear(config.num_classes, config.num_classes, rngs=rngs)
        self.shift = nnx.data(None)  # a frozen offset: ShiftedRetrieval

    def params(self) -> dict[str, Array]:
        """The score's parameters and, where the model has one, its frozen ``shift``."""
        return self.score() | ({} if self.shift is None else {"shift": self.shift[...]})

    def split(self, inputs: Float[Array, "B T F"]) -> tuple[Array, Array, Array]:
        """``q [B, 1, 1, D]``, ``k [B, 1, S, D]`` and the keys' one-hot values ``[B, S, V]``."""
        d = self.dim
        return inputs[:, None, -1:, :d], inputs[:, None, :-1, :d], inputs[:, :-1, d + 1 :]

    def logits(self, q: Array, k: Array, scale: float = 1.0) -> Float[Array, "B 1 1 S"]:
        """``scale · vᵀ act(pre-activations)`` of each key."""
        act = jnp.tanh if self.score.name == "additive" else jax.nn.relu
        p = self.params()
        hidden = act(preactivations(p, q, k))
        return scale * jnp.einsum("bnsa,na->bns", hidden, p["v"])[:, :, None]

    def __call__(self, batch: dict) -> Float[Array, "B T C"]:
        q, k, values = self.split(batch["inputs"])
        weights = jax.nn.softmax(self.logits(q, k), axis=-1)[:, 0, 0]  # [B, S]
        logits = self.readout(jnp.einsum("bs,bsv->bv", weights, values))
        return jnp.broadcast_to(logits[:, None], (*values.shape[:1], values.shape[1] + 1,
                                                  logits.shape[-1]))  # fmt: skip


@register(SHIFTED)
class ShiftedRetrieval(AdditiveRetrieval):
    """:class:`AdditiveRetrieval` whose pre-activations start off-centre on centred inputs:
    per unit the constant ``c = OFFSET · (W_q + W_k)ᵀ1 [1, A]`` of the initial weights. Without
    ``b``, ``c`` is a frozen ``shift`` (an ``nnx.Variable``, never trained); with ``b``, ``b``
    starts at ``c``."""

    def __init__(self, config: nn.ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        p = self.score()
        c = OFFSET * (p["w_q"] + p["w_k"]).sum(axis=1)
        if self.score.b is None:
            self.shift = nnx.Variable(c)
        else:
            self.score.b[...] = c


def dead_units(model: AdditiveRetrieval, batch: dict) -> Array:
    """``[A]``: whether each unit's pre-activation is ≤ 0 for every query and key of
    ``batch``."""
    q, k, _ = model.split(batch["inputs"])
    return (preactivations(model.params(), q, k) <= 0).all(axis=(0, 1, 2))


def _entropy(model: AdditiveRetrieval, q: Array, k: Array, scale: float = 1.0) -> float:
    weights = jax.nn.softmax(model.logits(q, k, scale), axis=-1)
    return float(analysis.entropy(weights).mean() / jnp.log(k.shape[2]))


def hidden_stats(model: AdditiveRetrieval, batch: dict) -> dict[str, float]:
    """On ``batch``: mean attention entropy / log S (also with v × ``SCALE``); the fraction of
    hidden pre-activations (``[B, 1, S, A]``, one per query, key and unit) with ``|·| > 2``
    (tanh' < 0.07); the fraction of (query, unit) pairs with every key's pre-activation ≤ 0
    (dead for that query under ReLU; reported); the fraction of units dead for every input."""
    q, k, _ = model.split(batch["inputs"])
    pre = preactivations(model.params(), q, k)
    off = pre <= 0
    values = (
        _entropy(model, q, k),
        (jnp.abs(pre) > 2).mean(),
        off.all(axis=2).mean(),
        dead_units(model, batch).mean(),
    )
    return dict(zip(STATS, map(float, values), strict=True)) | {
        SCALED: _entropy(model, q, k, SCALE)
    }


def base_config(smoke: bool) -> ExperimentConfig:
    """Impostor task without an impostor cue (norm 1: one more key at cosine 0.5), D = 8,
    8 keys; additive score with A = 32 hidden units; record seeds from ``FIRST_SEED``."""
    task = tasks.get("impostor").config(dim=DIM, num_keys=NUM_KEYS, impostor_norm=1.0)
    return ExperimentConfig(
        name="activation",
        task=task,
        model=dict(kind="additive_retrieval", score="additive", score_hidden=HIDDEN),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=20 if smoke else 1500,
            eval_every=10 if smoke else 500,
            batch_size=128,
            eval_batch_size=64 if smoke else 2048,
            seed=FIRST_SEED,
        ),
    )


def build(point: dict, seed: int, smoke: bool = False) -> tuple[AdditiveRetrieval, dict]:
    """``point``'s model as the sweep initializes it for ``seed`` and that seed's test batch."""
    config = with_overrides(base_config(smoke), point)
    model = nn.build(config.model, nnx.Rngs(jax.random.fold_in(jax.random.key(seed), INIT)))
    return model, get_trainer(config).eval_batch(seed, "test")


def mirror_negates(seed: int = 0) -> bool:
    """Identity: the bias-free tanh score of the mirrored inputs (−q, −K) is minus the score of
    (q, K) on a batch; with ``b = +1`` it is not (the check can fail)."""
    found = []
    for point in (CENTRED_NONE, CENTRED_PLUS):
        model, batch = build(point, seed, smoke=True)
        q, k, _ = model.split(batch["inputs"])
        logits, mirrored = model.logits(q, k), model.logits(-q, -k)
        found.append(bool(np.allclose(mirrored, -logits, atol=1e-6)))
    return found == [True, False]


def uniform_by_scale(seed: int = 0) -> bool:
    """Initialization fact: the bias-free tanh attention's entropy / log S is ≥ ``UNIFORM`` at
    initialization and below it with the same weights and v × ``SCALE`` (its uniformity is
    the weights' scale). On a batch of 64 queries × 8 keys."""
    model, batch = build(CENTRED_NONE, seed, smoke=True)
    q, k, _ = model.split(batch["inputs"])
    return _entropy(model, q, k) >= UNIFORM > _entropy(model, q, k, SCALE)


def centred_relu_alive(seed: int = 0) -> bool:
    """Theorem: on centred inputs no bias-free ReLU unit is dead for every input at
    initialization (its pre-activation is odd in the input, so it is positive on x or on −x
    unless its weights vanish); on the offset inputs some are (the check can fail)."""
    dead = [
        float(dead_units(*build(p, seed, smoke=True)).mean()) for p in (RELU_CENTRED, RELU_NONE)
    ]
    return dead[0] == 0.0 and dead[1] > 0


def dead_units_stay_dead(seed: int = 0) -> bool:
    """Initialization fact and theorem: on offset inputs some bias-free ReLU units are dead at
    initialization, and the logits' gradient is zero on every parameter of a dead unit (so,
    with no weight decay, it stays dead) and not on the live units' v (the check can fail)."""
    model, batch = build(RELU_NONE, seed, smoke=True)
    q, k, _ = model.split(batch["inputs"])
    dead = np.asarray(dead_units(model, batch))

    def total(p):
        hidden = jax.nn.relu(preactivations(p, q, k))
        return jnp.einsum("bnsa,na->", hidden, p["v"])

    grads = jax.grad(total)(model.params())
    zero = all(not np.asarray(grads[n])[..., dead].any() for n in ("w_q", "w_k", "v"))
    return bool(dead.any() and zero and np.asarray(grads["v"])[..., ~dead].all())


def plus_dead_within_none(seed: int = 0) -> bool:
    """Identity: at initialization (the same weights) a ReLU unit dead with ``b = +1`` is dead
    with no bias (monotonicity); the reverse inclusion fails where +1 rescues a unit."""
    dead_none, dead_plus = (np.asarray(dead_units(*build(p, seed, smoke=True)))
                            for p in (RELU_NONE, RELU_PLUS))  # fmt: skip
    return bool(not (dead_plus & ~dead_none).any())


CHECKS = (
    Check("the bias-free tanh score negates on mirrored inputs (−q, −K), the +1 bias's does "
          "not (why symmetric inputs cancel)", mirror_negates, kind="identity"),
    Check(f"bias-free tanh attention on centred inputs has entropy / log S ≥ {UNIFORM} at "
          f"initialization, below it with v × {SCALE:g} (its uniformity is the weights' scale)",
          uniform_by_scale, kind="initialization"),
    Check("on centred inputs no bias-free ReLU unit is dead for every input at initialization; "
          f"on inputs offset by {OFFSET:g} some are", centred_relu_alive, kind="theorem"),
    Check(f"on inputs offset by {OFFSET:g} some bias-free ReLU units are dead at initialization "
          "and a dead unit's parameters get no gradient", dead_units_stay_dead,
          kind="initialization"),
    Check("at initialization a ReLU unit dead with b = +1 is dead without a bias",
          plus_dead_within_none, kind="identity"),
)  # fmt: skip


def _experiment(smoke: bool) -> Experiment:
    """The training sweep of :func:`analyze` (judged on its rows by :func:`judge`)."""
    return Experiment(
        name="activation", claim_id="S8", claim=" ".join(__doc__.split()),
        base=base_config(smoke), points=TRAINED, metric="loss", higher_is_better=False,
        verdict=lambda s: ("inconclusive", "judged on the rows by judge()"),
        learning_rates=(1e-3, 3e-3) if smoke else RATES, checks=CHECKS, pilot_seeds=PILOT_SEEDS,
    )  # fmt: skip


def common_rate(a: Stats, b: Stats) -> float:
    """The rate a pair of points is judged at: their common best rate, else the rate of their
    shared grid with the smallest sum of the two points' mean validation losses."""
    if a.learning_rate == b.learning_rate:
        return a.learning_rate
    valid_a, valid_b = ({lr: v for lr, v, _ in s.by_learning_rate} for s in (a, b))
    return min(sorted(valid_a.keys() & valid_b.keys()), key=lambda lr: valid_a[lr] + valid_b[lr])


def analyze(
    out: Path, smoke: bool, *, seeds: int | None = None, overwrite: bool = False
) -> record.Analysis:
    """Train :data:`TRAINED` for ``SEEDS`` seeds on the ``RATES`` grid (best rate on
    validation loss; each pair judged at :func:`common_rate`), then measure
    :func:`hidden_stats` of every point at initialization and of the trained points after
    training, on each seed's test batch. Judged by :func:`judge`, the module docstring's rule."""
    experiment = _experiment(smoke)
    seeds = seeds or (1 if smoke else SEEDS)
    seed_range = range(FIRST_SEED, FIRST_SEED + seeds)
    if not smoke and (shared := set(seed_range) & set(PILOT_SEEDS)):
        raise ValueError(f"seeds: the record would use the pilot seeds {sorted(shared)}")
    outcome = sweep(experiment, out, num_seeds=seeds, overwrite=overwrite)
    folders = dict(zip(map(label, TRAINED), outcome.folders, strict=True))
    judged = {}
    for pair in PAIRS.values():
        rate = common_rate(*(outcome.summary[p] for p in pair))
        judged |= {label(p): rate for p in pair}
    runs = record.read_rows(out / "results.csv")
    accuracy = {(r["point"], r["seed"], r["learning_rate"]): r["test_accuracy"] for r in runs}
    rows = []
    for point in POINTS:
        name = label(point)
        for seed in seed_range:
            model, batch = build(point, seed, smoke)
            row = {"point": name, "seed": seed}
            row |= {f"init {k}": v for k, v in hidden_stats(model, batch).items()}
            if point not in TRAINED:
                row |= {"learning_rate": float("nan"), "best rate": float("nan"), "rates": "",
                        "test_accuracy": float("nan")}  # fmt: skip
                row |= {f"trained {k}": float("nan") for k in (*STATS, SCALED)}
                rows.append(row)
                continue
            stats, rate = outcome.summary[point], judged[name]
            trained = load_run(folders[name], (seed, rate))[1]
            row |= {
                "learning_rate": rate,
                "best rate": stats.learning_rate,
                "rates": " ".join(f"{lr:g}" for lr, *_ in stats.by_learning_rate),
                "test_accuracy": accuracy[name, seed, rate],
            }
            row |= {f"trained {k}": v for k, v in hidden_stats(trained, batch).items()}
            rows.append(row)
    _plot(rows, out / "activation.png")
    tables = {"results.csv": runs, "analysis.csv": rows}
    return report_from_rows(tables, smoke)


def _column(rows: list[dict], point: dict, name: str) -> list[float]:
    """``name`` of ``point``'s rows in seed order (the pairing across points); every point
    must have the same seeds."""
    own = sorted((r for r in rows if r["point"] == label(point)), key=lambda r: r["seed"])
    if [r["seed"] for r in own] != sorted({r["seed"] for r in rows}):
        raise ValueError(f"{label(point)}: its seeds are not every point's seeds")
    return [r[name] for r in own]


def at_edge(rows: list[dict], point: dict) -> bool:
    """Whether the rate ``point`` is judged at is the smallest or largest of its grid (the
    grid grows until its best is interior or a bound is reached: so this is a bound reached)."""
    row = next(r for r in rows if r["point"] == label(point))
    rates = [float(r) for r in str(row["rates"]).split()]
    return not min(rates) < row["learning_rate"] < max(rates)


def _part(holds: bool, contradicted: bool) -> str:
    return "refuted" if contradicted else "supported" if holds else "inconclusive"


def _paired(a: list[float], b: list[float]) -> str:
    low, high = paired_lower(a, b), paired_upper(a, b)
    return f"{np.mean(a) - np.mean(b):+.3f} (paired one-sided 95% bounds {low:+.3f} to {high:+.3f})"


def _bounds(a: list[float]) -> str:
    return f"{np.mean(a):.3f} (one-sided 95% bounds {lower(a):.3f} to {upper(a):.3f})"


def _rates(rows: list[dict], pair: tuple[dict, dict]) -> str:
    """The pair's rate, and whether its points' own best rates agreed."""
    first = [next(r for r in rows if r["point"] == label(p)) for p in pair]
    best = [f"{r['best rate']:g}" for r in first]
    agreed = "agreed" if best[0] == best[1] else f"differed ({' vs '.join(best)}: common rate)"
    return f"judged at rate {first[0]['learning_rate']:g}, the points' best rates {agreed}"


def judge(rows: list[dict]) -> tuple[str, str, dict[str, str]]:
    """The rule of the module's docstring on the analysis rows (one per point and seed; the
    points' seeds are shared): ``(verdict, reason, parts)``."""
    col = functools.partial(_column, rows)
    entropy, plus0 = (col(p, "init entropy / log S") for p in (CENTRED_NONE, CENTRED_PLUS))
    scaled, plus_scaled = (col(p, f"init {SCALED}") for p in (CENTRED_NONE, CENTRED_PLUS))
    sat_init = col(TANH_NONE, "init saturated")
    sat_none, sat_bias = (col(p, "trained saturated") for p in PAIRS[B])
    dead0_none, dead0_plus = (col(p, "init dead for every input") for p in PAIRS[C])
    dead_none, dead_plus = (col(p, "trained dead for every input") for p in PAIRS[C])
    acc_none, acc_plus = (col(p, "test_accuracy") for p in PAIRS[C])
    c_parts = (
        _part(paired_lower(dead_none, dead_plus) > EFFECT,
              paired_upper(dead_none, dead_plus) < EFFECT),
        _part(paired_lower(acc_plus, acc_none) > -ACCURACY_MARGIN,
              paired_upper(acc_plus, acc_none) < -ACCURACY_MARGIN),
    )  # fmt: skip
    parts = {
        B: _part(paired_lower(sat_none, sat_bias) > EFFECT,
                 paired_upper(sat_none, sat_bias) < EFFECT),
        C: combine(c_parts),
    }  # fmt: skip
    edges = {k: [label(p) for p in PAIRS[k] if at_edge(rows, p)] for k in parts}
    parts = {k: "inconclusive" if edges[k] and v == "refuted" else v for k, v in parts.items()}
    tost = "holds" if equivalent(sat_none, sat_bias, EFFECT) else "does not hold"
    reason = (
        f"Not judged (initialization): centred inputs, tanh, no bias, entropy / log S "
        f"{_bounds(entropy)}; the same weights with b = +1 {np.mean(plus0):.3f}, no bias minus "
        f"+1 {_paired(entropy, plus0)}; scale control, v × {SCALE:g}: no bias "
        f"{np.mean(scaled):.3f}, +1 {np.mean(plus_scaled):.3f}, no bias minus +1 "
        f"{_paired(scaled, plus_scaled)}. (b) centred inputs, tanh, pre-activations offset by "
        f"{OFFSET:g}·(W_q + W_k)ᵀ1 (saturated at init {np.mean(sat_init):.3f}): trained "
        f"saturated fraction with the offset frozen {np.mean(sat_none):.3f}, with a learnable "
        f"bias from it {np.mean(sat_bias):.3f}, reduction {_paired(sat_none, sat_bias)} against "
        f"{EFFECT} (equivalence within ±{EFFECT}: {tost}); {_rates(rows, PAIRS[B])}. (c) "
        f"inputs offset by {OFFSET:g}, ReLU, fraction of units dead for every input without a "
        f"bias (reported): init {np.mean(dead0_none):.3f}, trained {_bounds(dead_none)}; "
        f"reduction by a bias from +{PLUS:g}: at init {_paired(dead0_none, dead0_plus)} (built "
        f"in), trained {_paired(dead_none, dead_plus)} against {EFFECT}: {c_parts[0]}; test "
        f"accuracy +{PLUS:g} minus no bias {_paired(acc_plus, acc_none)} (margin "
        f"−{ACCURACY_MARGIN}): {c_parts[1]}; {_rates(rows, PAIRS[C])}. Parts: "
        + "; ".join(f"{k}: {v}" for k, v in parts.items())
        + "."
    )
    for k, points in edges.items():
        if points:
            reason += f" {k[:3]}: rate at a grid bound ({', '.join(points)}): no refutation."
    return combine(parts.values()), reason, parts


def report_from_rows(tables: dict[str, list[dict]], smoke: bool = False) -> record.Analysis:
    """The record of :func:`analyze` from the sweep's ``results.csv`` and its own
    ``analysis.csv``: tables, checks, verdict and reason; the verdict is inconclusive when a
    Check fails. A ``Differs`` if the rows hold a pilot seed."""
    rows = tables["analysis.csv"]
    if not smoke and (pilot := sorted({r["seed"] for r in rows} & set(PILOT_SEEDS))):
        raise Differs(f"analysis.csv: measured on the pilot seeds {pilot}")
    experiment = _experiment(smoke)
    summary, _ = summarize(experiment, tables["results.csv"])
    checks = run_checks(CHECKS)
    verdict, reason, _ = judge(rows)
    if not all(ok for _, ok in checks):
        verdict, reason = "inconclusive", f"a Check failed: not evidence. {reason}"
    header = ["point", "lr (judged)", "test accuracy", *(f"{k} (init)" for k in STATS), *STATS]
    table_rows = []
    for point in POINTS:
        group = [r for r in rows if r["point"] == label(point)]
        trained = point in TRAINED
        table_rows.append([label(point), f"{group[0]['learning_rate']:g}" if trained else "–",
                           fmt(*mean_ci95([r["test_accuracy"] for r in group])) if trained
                           else "not trained",
                           *(f"{np.mean([r[f'init {k}'] for r in group]):.3f}" for k in STATS),
                           *(f"{np.mean([r[f'trained {k}'] for r in group]):.3f}" if trained
                             else "–" for k in STATS)])  # fmt: skip
    seeds = sorted({r["seed"] for r in rows})
    body = "\n".join([
        sweep_tables(experiment, summary),
        "Per point, mean over seeds (the points share their seeds): test accuracy (± 95%) at "
        "the rate its pair is judged at, and the hidden statistics at initialization and after "
        "training.\n",
        markdown_table(header, table_rows),
        f"**Checks** (hold by construction; not evidence, not counted in the verdict; a "
        f"failure voids it): {checks_text(checks)}.\n",
        f"**Seeds.** Record seeds {seeds}; pilot seeds {list(PILOT_SEEDS)} are not among them.\n",
    ])  # fmt: skip
    return record.analysis(
        "activation", "S8", rows, body, (verdict, reason), ["summary.png", "activation.png"],
        csv_name="analysis.csv",
    )  # fmt: skip


def _plot(rows: list[dict], path: Path) -> None:
    fig, axes = new_figure(1, 4, figsize=(17, 4))
    names = [label(p) for p in POINTS]
    y = np.arange(len(POINTS))
    for ax, name in zip(axes, STATS, strict=True):
        for when, dy in (("init", -0.15), ("trained", 0.15)):
            means = [np.mean(_column(rows, p, f"{when} {name}")) for p in POINTS]
            ax.barh(y + dy, np.nan_to_num(means), height=0.3, label=when)
        ax.set_xlabel(name)
        ax.legend(fontsize=7)
        ax.set_yticks(y, names if ax is axes[0] else [""] * len(y), fontsize=7)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path, f"additive retrieval, D = {DIM}, A = {HIDDEN}, {NUM_KEYS} keys")
