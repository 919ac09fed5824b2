"""CLAIMS M3: at initialization, the expected output norm of multi-head attention does not depend
on the number of heads h at fixed total width D; averaging h heads reduces variance ≈ σ²/h.
Measured over many initializations of :class:`attnjax.nn.MultiHeadAttention` (width D, Xavier
init, scaled dot product), 2048 per h in 64 groups of 32 that share one input x ~ N(0, 1); the
64 inputs are the same for every h (paired comparisons); the unscaled dot product is reported
beside it, not judged. The output is the sum of the heads' contributions, ``out = Σ_i c_i``;
per initialization ``s = ‖out‖² / (T D)``.

Declared before the full run of this design (judged on the scaled dot product, h = 2…16
against h = 1; 95% intervals by bootstrap over the 64 inputs, paired across h — each input's
statistics over its 32 initializations are independent across inputs — 2000 resamples, fixed
seeds):

* **Part 1 (judged): expected norm.** ``E s`` at h over ``E s`` at h = 1 (over inputs and
  initializations). Not an identity: the scaled scores' law (hence the softmax's concentration)
  depends on the head dimension D/h beyond its variance; the unscaled dot product shows the
  ratio can move. Interval: BCa, paired over inputs (each input's mean over its
  initializations). *Supported* iff every h's interval lies within [0.9, 1/0.9], *refuted* iff
  some h's lies outside [0.8, 1.25], else *inconclusive*.
* **Part 2 (judged): averaging reduces variance ≈ σ²/h, read directly.** ``ρ_h = E_x
  Var_init(s | x) / (the same at h = 1)``: the variance over initializations of the output's
  squared norm at a fixed input (an input is no initialization), averaged over inputs; predicted
  ``1/h``. Judged: the exponent β, minus the least-squares slope of ``log ρ_h`` on ``log h``
  over h = 1…16 (predicted 1). Interval: percentile, the same input resamples for every h.
  *Supported* iff β's interval lies within [0.75, 1.25], *refuted* iff it lies outside
  [0.5, 1.5], else *inconclusive*. Lack of fit is reported beside it, not judged: the local
  exponents ``β_h = −log ρ_h / log h`` with their intervals.
* **Explanation (reported, not judged).** Given x the heads' weights are disjoint and
  independent, and E c_i = 0 (flipping head i's output-projection rows flips c_i), so
  ``Var s = Σ_i Var‖c_i‖² + 4 Σ_{i<j} E⟨c_i, c_j⟩²`` (over T D): the relative variance
  ``CV²_h = Var s / (E s)²`` is ``F + (κ_h − F)/h``, with ``κ_h`` one head's relative variance
  of ``‖c_i‖²`` at this h and ``F = 2 tr C² / (tr C)²`` (C: the output's covariance over
  initializations) the floor that the norm of a Gaussian vector keeps however many heads it
  sums. Averaging shrinks only the excess ``e_h = CV²_h − F``, and only if κ_h does not grow as
  the heads shrink (D/h). Reported per h: CV²_h, F, κ_h, e_h (an excess ≤ 0 is flagged, its
  exponent left undefined, never clipped), the excess's local and pooled exponents, and the
  CV² over initializations *and* inputs (the input varying), beside the conditional one.
* **Check: independent heads** (an identity at fixed input, never counted): measured CV²_h ÷
  ``F + (κ_h − F)/h`` (ratio of means over inputs, BCa paired over inputs). Passes iff every
  h ≥ 2's interval, both scores, lies within [0.9, 1.1].
* **Check: cross terms** (holds by construction, never counted): ``E‖Σ c_i‖² / Σ E‖c_i‖² = 1``
  — the heads' cross terms vanish in expectation. Passes iff every h ≥ 2's interval (BCa,
  paired over inputs), both scores, lies within [0.98, 1.02]. It tests the gating and the
  summation (it fails for duplicated heads, a gate that leaks another head, or a sum that
  counts a head twice); it does not detect heads that share output weights (their cross terms
  still vanish in expectation).

The claim is supported iff both parts are, refuted iff either is, else inconclusive.

What refutes part 1: at some h the expected norm differs from h = 1 by more than 20–25% beyond
sampling error (as it does for the unscaled dot product). What refutes part 2: the conditional
variance of the norm falls clearly slower than h^(−1/2) (or faster than h^(−3/2)). Its known
causes, which the explanation columns separate: the Gaussian floor F, which no number of heads
averages away, and smaller heads (D/h) whose norms fluctuate more (κ_h growing with h).

Keys and pilots (disclosure): a record's initializations for h are
``split(fold_in(key(h), 2), 2048)``, its 64 inputs ``normal(fold_in(key(0), 1 << 20))``, shared
by every h. The earlier draft's smoke runs used ``split(key(h), 64)`` — the first 64
initializations of the old record's stream (which used ``split(key(h), seeds)``), each with its
own input; the publish stream shares no key with them, nor with a referee's check on
``key(7000 + h)`` (which measured a direct pooled slope of 0.16 [0.11, 0.20]), nor with this
design's smoke (``key(1000 + h)``, inputs from ``key(1000)``). The choice of conditioning on
the input was made after those first smoke runs; the judged quantity (part 2 read directly)
was fixed after the referee's review, which had measured it on its own keys.

Note after the full run (no rule changed): the independent-heads check came out FAIL on its
intervals' width, not its points (three of eight intervals reach past 1.1, the furthest scaled
dot h = 8: 1.053 [0.988, 1.120]; every interval contains 1); κ_h, estimated from 32
initializations per input, is what makes it wide.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import stats

from attnjax import nn
from attnjax.experiment import combine, record
from attnjax.experiment.parts import Check, checks_text, run_checks
from attnjax.experiment.report import markdown_table, new_figure, save_figure

WIDTH, TOKENS = 64, 16
XAVIER = nnx.initializers.xavier_uniform()  # the record's initialization (Flax's is LeCun)
HEADS = (1, 2, 4, 8, 16)
SCORES = ("scaled_dot", "dot")
INITS, INPUTS = 2048, 64  # initializations per h, in groups of 32 on one input each
PILOT = 1000  # a smoke run's keys: key(PILOT + h), inputs from key(PILOT); never the record's
RESAMPLES = 2000
TIGHT, LOOSE = (0.9, 1 / 0.9), (0.8, 1.25)  # norm ratio "≈ 1": interval inside; "≠ 1": outside
AVERAGING_TIGHT, AVERAGING_LOOSE = (0.75, 1.25), (0.5, 1.5)  # exponent β "≈ 1"; "≠ 1"
INDEPENDENT_BAND = (0.9, 1.1)  # check: measured CV² ÷ independent heads' CV²
CROSS_BAND = (0.98, 1.02)  # check: E‖Σc‖² / ΣE‖c‖²


def head_contributions(key: jax.Array, heads: int, score: str, x=None) -> jax.Array:
    """``[heads, T, D]``: each head's contribution to the output of a freshly initialized layer
    (the layer with every other head's gate at 0; the output is their sum, the out bias being 0
    at init) on the input ``x`` (``[1, T, D]``; None: ``x ~ N(0, 1)`` drawn from ``key``)."""
    layer = nn.add_head_gates(
        nn.MultiHeadAttention(heads, WIDTH, score=score, kernel_init=XAVIER, rngs=nnx.Rngs(key))
    )
    if x is None:
        x = jax.random.normal(jax.random.fold_in(key, 1), (1, TOKENS, WIDTH))
    graphdef, gate, rest = nnx.split(layer, nn.HeadGate, ...)

    def one_head(onehot):
        gated = jax.tree.map(lambda g: onehot.astype(g.dtype), gate)
        return nnx.merge(graphdef, gated, rest)(x)[0]

    return jax.vmap(one_head)(jnp.eye(heads))


def per_seed(
    seeds: int, heads: int, score: str, base: int = 0, inputs: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Per initialization: the output ``Σ_i c_i`` flattened, ``[seeds, T D]``, and each head's
    mean square ``‖c_i‖² / (T D)``, ``[seeds, heads]``. Initializations
    ``split(fold_in(key(base + heads), 2), seeds)``, in ``inputs`` consecutive groups of equal
    size, group g on input g of ``normal(fold_in(key(base), 1 << 20))`` (the same inputs for
    every h)."""
    key = jax.random.key(base + heads)
    xs = jax.random.normal(
        jax.random.fold_in(jax.random.key(base), 1 << 20), (inputs, 1, TOKENS, WIDTH)
    )
    xs = jnp.repeat(xs, seeds // inputs, axis=0)
    run = jax.jit(jax.vmap(lambda k, x: head_contributions(k, heads, score, x)))
    c = run(jax.random.split(jax.random.fold_in(key, 2), seeds), xs)
    return np.asarray(jnp.sum(c, axis=1).reshape(seeds, -1)), np.asarray(jnp.mean(c**2, (2, 3)))


def _ratio_ci(a, b, paired: bool = True) -> tuple[float, float, float]:
    """``mean(a) / mean(b)`` and its 95% bootstrap interval (BCa, fixed seed)."""
    res = stats.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis) / y.mean(axis),
                          paired=paired, n_resamples=RESAMPLES, random_state=0)  # fmt: skip
    return float(a.mean() / b.mean()), *map(float, res.confidence_interval)


def norm_excess(out: np.ndarray, weights: np.ndarray, groups: int = 1) -> tuple[np.ndarray, ...]:
    """``(CV², F, CV² − F)`` of ``s = ‖out‖²`` over initializations at one input, ``[B,
    groups]``: ``out`` (``[n, N]``) in ``groups`` consecutive groups of equal size (one input
    each), one value per group and per row of ``weights`` (``[B, n]``: how often each
    initialization is drawn; a row of ones is the sample itself). ``F = 2 Σ_{a≠b} ⟨o_a, o_b⟩²
    / Σ_{a≠b} ‖o_a‖² ‖o_b‖²`` over pairs of distinct initializations (E out = 0)."""
    o = out.astype(np.float64).reshape(groups, -1, out.shape[-1])
    w = weights.astype(np.float64).reshape(len(weights), groups, -1)
    sq = np.sum(o**2, axis=-1)
    gram2 = np.einsum("kan,kbn->kab", o, o) ** 2 * (1 - np.eye(o.shape[1]))
    n, total = w.sum(-1), np.einsum("bkm,km->bk", w, sq)
    cv2 = (np.einsum("bkm,km->bk", w, sq**2) / n - (total / n) ** 2) / (n - 1) * n**3 / total**2
    pairs = np.einsum("rka,kab,rkb->rk", w, gram2, w, optimize=True)
    floor = 2 * pairs / (total**2 - np.einsum("bkm,km->bk", w**2, sq**2))
    return cv2, floor, cv2 - floor


def _exponent(e1, eh, heads: int):
    """``β_h = log(e_1 / e_h) / log h``; NaN where either is at or below 0 (undefined, never
    clipped)."""
    e1, eh = np.asarray(e1, float), np.asarray(eh, float)
    ok = (e1 > 0) & (eh > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.log(np.where(ok, e1 / eh, 1.0)) / np.log(heads), np.nan)


def _pooled(heads, values: np.ndarray) -> np.ndarray:
    """β: minus the least-squares slope of ``log v_h`` on ``log h`` over ``heads``, one per row
    of ``values`` (``[B, len(heads)]``); NaN for a row with a value at or below 0."""
    x = np.log(heads) - np.mean(np.log(heads))
    values = np.asarray(values, float)
    ok = np.all(values > 0, axis=-1)
    return np.where(ok, -np.log(np.where(values > 0, values, 1.0)) @ x / (x @ x), np.nan)


def _percentile(samples: np.ndarray) -> tuple[float | None, float | None, float]:
    """95% percentile interval of ``samples`` and the fraction of them that is NaN (undefined:
    an excess ≤ 0); None, None if any is."""
    bad = float(np.mean(np.isnan(samples)))
    if bad > 0:
        return None, None, bad
    low, high = np.quantile(samples, (0.025, 0.975))
    return float(low), float(high), 0.0


def _judge(intervals, tight=TIGHT, loose=LOOSE) -> str:
    if any(lo is None or hi is None for _, lo, hi in intervals):
        return "inconclusive"
    if any(hi < loose[0] or lo > loose[1] for _, lo, hi in intervals):
        return "refuted"
    inside = all(tight[0] <= lo and hi <= tight[1] for _, lo, hi in intervals)
    return "supported" if inside else "inconclusive"


def _none(v):
    return None if v is None or not np.isfinite(v) else float(v)


def analyze(out: Path, smoke: bool, *, overwrite: bool = False) -> record.Analysis:
    """For h in ``HEADS`` (D = 64, T = 16) and many initializations: the parts, explanation and
    checks of the module's docstring, with the rule declared there."""
    seeds, inputs, heads = (64, 8, (1, 4)) if smoke else (INITS, INPUTS, HEADS)
    rows = []
    for k, score in enumerate(SCORES):
        drawn = np.random.default_rng(k).integers(inputs, size=(RESAMPLES, inputs))  # paired
        per_h = []
        for h in heads:
            outs, each = per_seed(seeds, h, score, PILOT if smoke else 0, inputs)
            s = np.mean(outs.astype(np.float64) ** 2, axis=1)
            by_input = s.reshape(inputs, -1)
            heads_by_input = each.astype(np.float64).reshape(inputs, -1, h)
            kappa = np.mean(
                heads_by_input.var(axis=1, ddof=1) / heads_by_input.mean(axis=1) ** 2, axis=1
            )  # per input: one head's CV² of ‖c_i‖², mean over the (exchangeable) heads
            cv2, floor, excess = (v[0] for v in norm_excess(outs, np.ones((1, seeds)), inputs))
            per_h.append({"mean": by_input.mean(1), "var": by_input.var(1, ddof=1),
                          "separate": heads_by_input.sum(2).mean(1), "cv2": cv2,
                          "floor": floor, "excess": excess, "kappa": kappa,
                          "predicted": floor + (kappa - floor) / h,
                          "uncond": float(s.var(ddof=1) / s.mean() ** 2)})  # fmt: skip
        var_boot = np.stack([p["var"][drawn].mean(1) for p in per_h], 1)  # [RESAMPLES, H]
        excess_boot = np.stack([p["excess"][drawn].mean(1) for p in per_h], 1)
        var_point = np.array([p["var"].mean() for p in per_h])
        excess_point = np.array([p["excess"].mean() for p in per_h])
        beta = _none(_pooled(heads, var_point[None])[0]), *_percentile(_pooled(heads, var_boot))[:2]
        ex_slope = _pooled(heads, excess_point[None])[0]
        ex_low, ex_high, ex_bad = _percentile(_pooled(heads, excess_boot))
        one = (1.0, 1.0, 1.0)
        for j, (h, p) in enumerate(zip(heads, per_h, strict=True)):
            base = per_h[0]
            several = h > 1
            norm = _ratio_ci(p["mean"], base["mean"]) if several else one
            cross = _ratio_ci(p["mean"], p["separate"]) if several else one
            indep = _ratio_ci(p["cv2"], p["predicted"]) if several else one
            rho = var_point[j] / var_point[0], *np.quantile(
                var_boot[:, j] / var_boot[:, 0], (0.025, 0.975))  # fmt: skip
            local = (
                (float(-np.log(rho[0]) / np.log(h)),
                 *_percentile(-np.log(var_boot[:, j] / var_boot[:, 0]) / np.log(h))[:2])
                if several else (None, None, None)
            )  # fmt: skip
            ex_local = (
                _none(_exponent(excess_point[0], excess_point[j], h)),
                *_percentile(_exponent(excess_boot[:, 0], excess_boot[:, j], h))[:2],
            ) if several else (None, None, None)  # fmt: skip
            rows.append({"point": f"{score} h={h}", "seed": 0, "score": score, "heads": h,
                         "inputs": inputs, "output_mean_square": float(p["mean"].mean()),
                         "norm_ratio": norm[0], "norm_ratio_low": norm[1],
                         "norm_ratio_high": norm[2],
                         "norm_variance": float(var_point[j]), "rho": float(rho[0]),
                         "rho_low": float(rho[1]), "rho_high": float(rho[2]),
                         "local_exponent": local[0], "local_exponent_low": local[1],
                         "local_exponent_high": local[2],
                         "exponent": beta[0], "exponent_low": beta[1], "exponent_high": beta[2],
                         "norm_cv2": float(p["cv2"].mean()), "input_cv2": p["uncond"],
                         "gaussian_floor": float(p["floor"].mean()),
                         "kappa": float(p["kappa"].mean()),
                         "independent_cv2": float(p["predicted"].mean()),
                         "independence_ratio": indep[0], "independence_ratio_low": indep[1],
                         "independence_ratio_high": indep[2],
                         "norm_excess": float(excess_point[j]),
                         "excess_exponent": ex_local[0], "excess_exponent_low": ex_local[1],
                         "excess_exponent_high": ex_local[2],
                         "excess_slope": _none(ex_slope), "excess_slope_low": ex_low,
                         "excess_slope_high": ex_high, "excess_undefined": ex_bad,
                         "cross_ratio": cross[0], "cross_ratio_low": cross[1],
                         "cross_ratio_high": cross[2]})  # fmt: skip
    _plot(rows, out / "summary.png")
    return report_from_rows({"results.csv": rows}, seeds)


def report_from_rows(tables: dict[str, list[dict]], seeds: int = INITS) -> record.Analysis:
    """The record of :func:`analyze` from its rows (one per score and h) and the number of
    initializations per h it measured: table, checks, verdict and reason."""
    rows = tables["results.csv"]
    at = {(r["score"], r["heads"]): r for r in rows}
    several = [h for s, h in at if s == "scaled_dot" and h > 1]  # h = 1 is the reference

    def interval(r: dict, name: str) -> tuple:
        return r[name], r[f"{name}_low"], r[f"{name}_high"]

    parts = {
        "norm": _judge([interval(at["scaled_dot", h], "norm_ratio") for h in several]),
        "averaging": _judge(
            [interval(at["scaled_dot", 1], "exponent")], AVERAGING_TIGHT, AVERAGING_LOOSE
        ),
    }
    verdict = combine(parts.values())
    late = [r for r in rows if r["heads"] > 1]
    checks = checks_text(run_checks((
        Check("measured CV² ÷ independent heads' F + (κ_h − F)/h within [0.9, 1.1]",
              lambda: _judge([interval(r, "independence_ratio") for r in late],
                             INDEPENDENT_BAND, (0, np.inf)) == "supported",
              kind="initialization"),
        Check("E‖Σc‖² / ΣE‖c‖² within [0.98, 1.02] (cross terms vanish in expectation)",
              lambda: _judge([interval(r, "cross_ratio") for r in late],
                             CROSS_BAND, (0, np.inf)) == "supported",
              kind="initialization"),
    )))  # fmt: skip

    def cell(r, name, digits=3):
        if r[name] is None:
            return "–"
        if r[f"{name}_low"] is None:
            return "{:.{d}f} [undefined: an excess ≤ 0]".format(r[name], d=digits)
        return "{:.{d}f} [{:.{d}f}, {:.{d}f}]".format(*interval(r, name), d=digits)

    def span(name, score="scaled_dot", digits=3):
        values = [at[score, h][name] for h in several]
        if any(v is None for v in values):
            return "undefined at some h (an excess ≤ 0)"
        return f"{min(values):.{digits}f}–{max(values):.{digits}f}"

    def values(name, score="scaled_dot"):
        return ", ".join(f"{r[name]:.4f}" for (s, _), r in sorted(at.items()) if s == score)

    def each(name, score="scaled_dot", digits=3):
        return ", ".join(f"h={h}: {cell(at[score, h], name, digits)}" for h in several)

    def slope(r):
        if r["excess_slope"] is None:
            return "undefined (an excess ≤ 0)"
        if r["excess_slope_low"] is None:
            return (f"{r['excess_slope']:.2f} (flagged: an excess ≤ 0 in "
                    f"{100 * r['excess_undefined']:.1f}% of resamples)")  # fmt: skip
        return cell(r, "excess_slope", 2)

    one = at["scaled_dot", 1]
    hs = ", ".join(str(h) for s, h in sorted(at) if s == "scaled_dot")
    reason = (
        f"scaled dot, h = {several[0]}…{several[-1]} over {seeds} initializations on the same "
        f"{one['inputs']} inputs: E‖out‖² ÷ (h = 1) {each('norm_ratio')} ({parts['norm']}); "
        f"Var over initializations of ‖out‖² at one input ÷ (h = 1) falls as h^−β, β = "
        f"{cell(one, 'exponent', 2)} (1 predicted, i.e. ≈ σ²/h; {parts['averaging']}; local "
        f"β_h {each('local_exponent', digits=2)}). Explanation (not judged), h = {hs}: CV²(s|x) "
        f"{values('norm_cv2')}; independent heads' F + (κ_h − F)/h {values('independent_cv2')}; "
        f"Gaussian floor F {values('gaussian_floor')} (no number of heads averages it); one "
        f"head's κ_h {values('kappa')}; pooled exponent of the excess CV² − F "
        f"{slope(one)}. Checks (not counted): {checks}. Unscaled dot (not judged): norm ratio "
        f"{span('norm_ratio', 'dot')}, β = {cell(at['dot', 1], 'exponent', 2)}."
    )

    header = ["score", "h", "E out² (per entry)", "÷ (h = 1) [95%]",
              "ρ_h = Var(s|x) ÷ (h = 1) [95%]", "local β_h [95%]", "CV²(s|x)",
              "CV² (x varying)", "floor F", "κ_h", "F + (κ_h − F)/h",
              "measured ÷ independent [95%] (check)", "excess e_h", "excess local exp. [95%]",
              "E‖Σc‖² / ΣE‖c‖² [95%] (check)"]  # fmt: skip
    table = [[r["score"], r["heads"], f"{r['output_mean_square']:.4f}", cell(r, "norm_ratio"),
              cell(r, "rho"), cell(r, "local_exponent", 2), f"{r['norm_cv2']:.4f}",
              f"{r['input_cv2']:.4f}", f"{r['gaussian_floor']:.4f}", f"{r['kappa']:.4f}",
              f"{r['independent_cv2']:.4f}", cell(r, "independence_ratio"),
              f"{r['norm_excess']:.4f}" + (" (≤ 0: flagged)" if r["norm_excess"] <= 0 else ""),
              cell(r, "excess_exponent", 2), cell(r, "cross_ratio", 4)]
             for r in rows]  # fmt: skip
    ratios = [r["independence_ratio"] for r in late]
    contain = sum(r["independence_ratio_low"] <= 1 <= r["independence_ratio_high"] for r in late)
    outside = sum(
        r["independence_ratio_low"] < INDEPENDENT_BAND[0]
        or r["independence_ratio_high"] > INDEPENDENT_BAND[1]
        for r in late
    )
    widest = max((r["independence_ratio_high"] - r["independence_ratio_low"]) / 2 for r in late)
    pooled = "; ".join(
        f"{score}: β = {cell(at[score, 1], 'exponent', 2)}, excess exponent {slope(at[score, 1])}"
        for score in SCORES
    )
    body = (
        f"Width D = {WIDTH}, T = {TOKENS} tokens, {seeds} initializations per h on the same "
        f"{rows[0]['inputs']} inputs (paired across h); s = ‖out‖² / (T D); c_i is head i's "
        f"contribution to the output. Judged: ρ_h = E_x Var(s | x) ÷ (h = 1), predicted 1/h; "
        f"β = −(slope of log ρ_h on log h over all h), predicted 1; local β_h = −log ρ_h / log h "
        f"(lack of fit). Explanation, not judged: CV²(s|x) = Var(s|x) / E(s|x)² (mean over "
        f"inputs), and beside it the CV² of s over initializations and inputs together; "
        f"F = 2 tr C² / (tr C)² the Gaussian floor; κ_h one head's relative variance of "
        f"‖c_i‖²; F + (κ_h − F)/h the CV² of h independent heads (an identity at fixed input); "
        f"e_h = CV² − F and its local exponent log(e_1 / e_h) / log h (undefined, flagged, if "
        f"an excess ≤ 0).\n\nPooled: {pooled}.\n\n"
        + markdown_table(header, table)
        + f"\n**Checks** (hold by construction; not evidence, not counted in the verdict): "
        f"{checks}.\n\nIndependent heads in detail (measured ÷ predicted CV², h ≥ 2, both "
        f"scores): points {min(ratios):.3f}–{max(ratios):.3f}; {contain} of {len(late)} "
        f"intervals contain 1; {outside} reach outside [0.9, 1.1] (widest half-width "
        f"{widest:.3f}).\n"
    )
    return record.analysis("head_init", "M3", rows, body, (verdict, reason), ["summary.png"])


def _plot(rows: list[dict], path: Path) -> None:
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(10, 3.6))
    for score, style in (("scaled_dot", "o-"), ("dot", "s--")):
        mine = [r for r in rows if r["score"] == score]
        heads = np.array([r["heads"] for r in mine])
        norm = np.array([[r["norm_ratio"], r["norm_ratio_low"], r["norm_ratio_high"]]
                         for r in mine])  # fmt: skip
        ax1.errorbar(heads, norm[:, 0], yerr=[norm[:, 0] - norm[:, 1], norm[:, 2] - norm[:, 0]],
                     fmt=style, ms=4, capsize=3, label=score)  # fmt: skip
        rho = np.array([[r["rho"], r["rho_low"], r["rho_high"]] for r in mine])
        ax2.errorbar(heads, rho[:, 0], yerr=[rho[:, 0] - rho[:, 1], rho[:, 2] - rho[:, 0]],
                     fmt=style, ms=4, capsize=3, label=f"{score}: ρ_h")  # fmt: skip
    ax2.plot(heads, 1 / heads, ":", color="gray", label="1/h (claimed)")
    ax1.axhline(1, color="gray", lw=1)
    ax1.set_ylabel("E out² / E out² at h = 1")
    ax2.set_yscale("log")
    ax2.set_ylabel("Var(‖out‖² | x) / (h = 1)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("heads h (fixed width D)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, f"multi-head attention at initialization, D = {WIDTH}")
