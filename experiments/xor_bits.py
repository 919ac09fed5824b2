"""CLAIMS E2: with no positional encoding, one attention head, with a skip connection and a
linear readout and no MLP or LayerNorm after attention, cannot compute XOR of two bits (its
output at "=" depends only on the count of ones and moves along a line as it goes 0 → 1 → 2, so
a threshold gets at most 3 of the 4 inputs right, 75%). Two heads can compute it; one head
followed by an MLP can; one head with LayerNorm (before attention and after the block) can.
Each *can* is established by construction (a witness: hand-set parameters of the model the
sweep trains, accepted by declared criteria; a proof, not an experiment). The claim's "1 head
caps at 75%" and "2 heads reach 100%", "lets 1 head solve it" also read as measurements: *does*
parts judged by trained seeds (fresh seeds 5-9; seeds 0-4 were the pilot's) at every learning
rate of a declared grid (0.001 to 0.1, each rate its own point, overriding the base config's
0.01; column lr) with a declared budget (2000 steps). Every run and witness is evaluated on the four
inputs once each, so accuracy is exact (0, 1/4, 1/2, 3/4 or 1) and the cap is exactly 3/4."""

import functools
import math
from collections.abc import Callable
from pathlib import Path

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnjax import nn, tasks
from attnjax.experiment import (
    Check,
    Experiment,
    Part,
    Summary,
    combine,
    load_file,
    with_overrides,
)

_CONFIG = Path(__file__).parents[1] / "configs" / "xor_bits.py"
SOLVED = 1.0  # all four inputs right
ONE_HEAD = {"model.heads": 1, "model.mlp": False, "model.norms": False}
TWO_HEADS = ONE_HEAD | {"model.heads": 2}
WITH_MLP = ONE_HEAD | {"model.mlp": True}
WITH_LAYERNORM = ONE_HEAD | {"model.norms": True}
MODELS = (ONE_HEAD, TWO_HEADS, WITH_MLP, WITH_LAYERNORM)
# The does-parts' declared grid and budget (train.steps in configs/xor_bits.py: 2000).
RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
FIRST_SEED = 5  # record seeds 5-9; seeds 0-4 trained the pilot (the first record and its probes)
PILOT_SEEDS = (0, 1, 2, 3, 4)
# Witness acceptance criteria (the rule's, declared with it).
MAX_PARAM = 100.0  # every |parameter| at most this
MIN_GAP = 0.1  # every logit gap (correct − wrong) at least this
# ... and at least 2^10 float32 ulps (eps 2^-23) of the largest |activation| of the forward pass
PRECISION = 2.0**10 * 2.0**-23
MASKED = 1e30  # |values| from here up are masked-score sentinels (−inf, −0.7·float32 max)
NOISE, DRAWS, ROBUST = 1e-3, 200, 0.95  # ≥ 95% of N(0, NOISE²) perturbations still solve it


@functools.cache
def single_head_cap() -> float:
    """The best accuracy of one head + skip + linear readout over the four equally likely
    inputs. With no positions the output at ``"="`` depends only on the multiset of bits, and it
    moves along a line as the count of ones goes 0 → 1 → 2 (a projective image of the count), so
    a threshold gets the middle (XOR = 1) and at most one end right: 1 − the smaller end's
    share."""
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    ones = [int(row[:2].sum()) for row in batch["inputs"]]
    return 1 - min(ones.count(0), ones.count(2)) / len(ones)


# --- Witnesses: hand-set parameters of the model the sweep trains at each point -------------


def _point_model(point: dict) -> nnx.Module:
    """The model of ``point`` (``nn.build`` of the model of the experiment's own base config,
    ``get_experiment().base``, with the point's overrides), every parameter zero except
    LayerNorm scales (one)."""
    config = with_overrides(get_experiment().base, point)
    model = nn.build(config.model, nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(jnp.zeros_like, params))
    for _, norm in nnx.iter_graph(model):
        if isinstance(norm, nnx.LayerNorm):
            norm.scale[...] = jnp.ones(norm.scale.shape)
    return model


def _accuracy(model: nnx.Module) -> float:
    """Accuracy on the task's four inputs (``all_examples``), by the task's own metrics."""
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    return float(task.metrics(model(batch), batch)["accuracy"])


def _logit_gaps(model: nnx.Module) -> np.ndarray:
    """``logit[xor] − logit[1 − xor]`` at ``"="`` per input (all positive iff solved)."""
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    logits = np.asarray(model(batch))[:, -1]
    target = np.asarray(batch["targets"])[:, -1]
    return logits[np.arange(4), target] - logits[np.arange(4), 1 - target]


def _uniform_count_head(attention: nnx.Module, head: int, out_dim: int) -> None:
    """Head ``head``: query zero (every score equal, so uniform attention over the three
    tokens), value = the bit-1 indicator (embedding coordinate 1), written to residual
    coordinate ``out_dim``: there it adds n/3 for n ones."""
    attention.value.kernel[1, head, 0] = 1.0
    attention.out.kernel[head, 0, out_dim] = 1.0


def two_heads_model() -> nnx.Module:
    """Two heads, no MLP or LayerNorm. Embeddings: token t ↦ e_t. Head 0 attends uniformly and
    writes A(n) = n/3 to coordinate 3. Head 1 has a constant query and key score s = 12 on
    token 1 (0 on the others), so it writes B(n) = n·e^s / (n·e^s + 3 − n) ≈ [n ≥ 1] to
    coordinate 4. Readout: logit₁ − logit₀ = 4·(2B − 3A − 1/2) ≈ 4·(−1/2, +1/2, −1/2) at
    n = 0, 1, 2."""
    model = _point_model(TWO_HEADS)
    for t in range(3):
        model.embed.map.embedding[t, t] = 1.0
    attention = model.encoder.blocks[0].attention
    _uniform_count_head(attention, 0, 3)
    head_dim = attention.key.kernel.shape[-1]
    attention.query.bias[1, 0] = 1.0
    attention.key.kernel[1, 1, 0] = 12.0 * math.sqrt(head_dim)  # scores are scaled by 1/√head_dim
    attention.value.kernel[1, 1, 0] = 1.0
    attention.out.kernel[1, 0, 4] = 1.0
    model.readout.kernel[4, 1] = 8.0
    model.readout.kernel[3, 1] = -12.0
    model.readout.bias[1] = -2.0
    return model


def mlp_model() -> nnx.Module:
    """One head + MLP, no LayerNorm. Embeddings e_t; the head attends uniformly and writes
    a = n/3 to coordinate 3. The MLP (hidden units 0 and 1, k = 60) writes
    gelu(k(a − 1/6)) − 4·gelu(k(a − 1/2)) ≈ (0, 10, −10) at n = 0, 1, 2 to coordinate 5 (gelu is
    within 1e-20 of relu at |z| ≥ 10). Readout: logit₁ − logit₀ = coordinate 5 − k/12 =
    (−5, 5, −15)."""
    model = _point_model(WITH_MLP)
    for t in range(3):
        model.embed.map.embedding[t, t] = 1.0
    block, k = model.encoder.blocks[0], 60.0
    _uniform_count_head(block.attention, 0, 3)
    for unit, threshold in ((0, 1 / 6), (1, 1 / 2)):
        block.mlp.up.kernel[3, unit] = k
        block.mlp.up.bias[unit] = -k * threshold
    block.mlp.down.kernel[0, 5] = 1.0
    block.mlp.down.kernel[1, 5] = -4.0
    model.readout.kernel[5, 1] = 1.0
    model.readout.bias[1] = -k / 12
    return model


def layernorm_model() -> nnx.Module:
    """One head + LayerNorms (pre-attention and final, scale 1, bias 0), no MLP. Every
    embedding has zero mean: token 0 ↦ e₄ − e₅, token 1 ↦ e₆ − e₇, "=" ↦ κ(u − w) with
    u = e₀ − e₁, w = e₂ − e₃, where κ = LN(e₆ − e₇)₆ ≈ √8 is what the pre-attention LayerNorm
    makes of token 1's coordinate 6. The head attends uniformly; its value is that coordinate
    (zero for token 0 and "="), written along 3w, so it adds (n/3)·3κw = nκw: the block's
    output at "=" is
    x(n) = κ(u + (n − 1)w), a line through κu. The final LayerNorm (x has zero mean) divides by
    its root mean square: LN(x)·u = 2κ / √(κ²(2 + 2(n − 1)²)/16) = 4√2 at n = 1, 4 at n = 0, 2.
    Readout: logit₁ − logit₀ = 4·(LN(x)·u − (4√2 + 4)/2) ≈ 4·(−0.83, +0.83, −0.83)."""
    model = _point_model(WITH_LAYERNORM)
    block = model.encoder.blocks[0]
    embedding = model.embed.map.embedding
    for t, (plus, minus) in enumerate(((4, 5), (6, 7))):
        embedding[t, plus] = 1.0
        embedding[t, minus] = -1.0
    kappa = float(block.attention_norm(embedding[1])[6])
    for coordinate, sign in ((0, 1.0), (1, -1.0), (2, -1.0), (3, 1.0)):
        embedding[2, coordinate] = sign * kappa
    block.attention.value.kernel[6, 0, 0] = 1.0
    for coordinate, sign in ((2, 1.0), (3, -1.0)):
        block.attention.out.kernel[0, 0, coordinate] = 3.0 * sign
    model.readout.kernel[0, 1] = 4.0
    model.readout.kernel[1, 1] = -4.0
    model.readout.bias[1] = -2.0 * (4 * math.sqrt(2) + 4)
    return model


def _rated(model: dict) -> list[dict]:
    """The sweep's points of ``model``: one per learning rate of :data:`RATES`."""
    return [model | {"optim.learning_rate": lr} for lr in RATES]


def _walk(jaxpr, consts, args, seen: list[float]) -> list:
    """Evaluate ``jaxpr`` equation by equation (into calls), appending every floating
    intermediate's largest |value| below :data:`MASKED` to ``seen`` (masked scores)."""
    env = {}

    def read(v):
        return v.val if isinstance(v, jex.core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if isinstance(sub, jex.core.ClosedJaxpr):
            outs = _walk(sub.jaxpr, sub.consts, ins, seen)
        elif isinstance(sub, jex.core.Jaxpr):
            outs = _walk(sub, [], ins, seen)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
            if jnp.issubdtype(jnp.result_type(x), jnp.floating) and jnp.size(x):
                size = np.abs(np.asarray(x))
                seen.append(float(np.max(np.where(size < MASKED, size, 0.0))))
    return [read(v) for v in jaxpr.outvars]


def largest_activation(model: nnx.Module) -> float:
    """The largest |value| of any floating intermediate (parameters included) of the model's
    forward pass on the four inputs, masked-score sentinels (≥ :data:`MASKED`) left out."""
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, tree = jax.tree.flatten(params)

    def forward(*leaves):
        return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves), rest)(batch)

    closed = jax.make_jaxpr(forward)(*leaves)
    seen = [float(np.max(np.abs(x))) for x in leaves]
    _walk(closed.jaxpr, closed.consts, leaves, seen)
    return max(seen)


def acceptance(model: nnx.Module) -> dict[str, float | bool]:
    """The witness acceptance criteria, declared with the rule: accuracy 1 on the four inputs
    (float32, the task's metrics); every |parameter| ≤ :data:`MAX_PARAM`; every logit gap
    (correct − wrong) ≥ :data:`MIN_GAP` and ≥ :data:`PRECISION` (2^10 float32 ulps) times the
    largest |activation| of the forward pass (:func:`largest_activation`: a solution made of
    float32 rounding fails this);
    at least :data:`ROBUST` of :data:`DRAWS` perturbations of every parameter by N(0, NOISE²)
    still solve it (fixed key). ``accepted`` iff all hold."""
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, tree = jax.tree.flatten(params)
    largest = max(float(np.max(np.abs(x))) for x in leaves)
    gaps = _logit_gaps(model)
    activation = largest_activation(model)

    def perturbed(key):
        keys = jax.random.split(key, len(leaves))
        noisy = [
            x + NOISE * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)
        ]
        return task.metrics(nnx.merge(graphdef, jax.tree.unflatten(tree, noisy), rest)(batch),
                            batch)["accuracy"]  # fmt: skip

    accuracies = jax.jit(jax.vmap(perturbed))(jax.random.split(jax.random.key(0), DRAWS))
    robust = float(jnp.mean(accuracies >= SOLVED))
    found = {
        "accuracy": _accuracy(model),
        "largest_param": largest,
        "min_gap": float(gaps.min()),
        "largest_activation": activation,
        "robust": robust,
    }
    found["accepted"] = bool(
        found["accuracy"] >= SOLVED
        and largest <= MAX_PARAM
        and gaps.min() >= MIN_GAP
        and gaps.min() >= PRECISION * activation
        and robust >= ROBUST
    )
    return found


@functools.cache
def witness_two_heads() -> float:
    """Accuracy of :func:`two_heads_model` on the four inputs if it passes
    :func:`acceptance`, else 0."""
    found = acceptance(two_heads_model())
    return found["accuracy"] if found["accepted"] else 0.0


@functools.cache
def witness_mlp() -> float:
    """Accuracy of :func:`mlp_model` on the four inputs if it passes :func:`acceptance`,
    else 0."""
    found = acceptance(mlp_model())
    return found["accuracy"] if found["accepted"] else 0.0


@functools.cache
def witness_layernorm() -> float:
    """Accuracy of :func:`layernorm_model` on the four inputs if it passes :func:`acceptance`,
    else 0."""
    found = acceptance(layernorm_model())
    return found["accuracy"] if found["accepted"] else 0.0


@functools.cache
def cap_probe(draws: int = 256) -> bool:
    """The single-head theorem's premise and bound on the model the sweep trains: under
    ``draws`` random parameter draws (normal, scales 0.1 to 10), the logits at ``"="`` for
    ``[0, 1]`` and ``[1, 0]`` are equal (the output sees only the count of ones) and accuracy
    never exceeds :func:`single_head_cap`. A probe, not the proof (the proof is the docstring
    of :func:`single_head_cap`)."""
    graphdef, params, rest = nnx.split(_point_model(ONE_HEAD), nnx.Param, ...)
    task = tasks.get("xor_bits")
    batch = task.all_examples(task.config())
    leaves, tree = jax.tree.flatten(params)

    def one(key):
        scale_key, *keys = jax.random.split(key, len(leaves) + 1)
        scale = 10.0 ** jax.random.uniform(scale_key, minval=-1.0, maxval=1.0)
        drawn = [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
        model = nnx.merge(graphdef, jax.tree.unflatten(tree, drawn), rest)
        logits = model(batch)
        swap = jnp.max(jnp.abs(logits[1, -1] - logits[2, -1])) / (1 + jnp.max(jnp.abs(logits)))
        return task.metrics(logits, batch)["accuracy"], swap

    accuracy, swap = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), draws))
    return bool(jnp.max(accuracy) <= single_head_cap() + 1e-6 and jnp.max(swap) < 1e-4)


# --- The verdict rule --------------------------------------------------------------------


def above_cap(summary: Summary) -> int:
    """Trained one-head runs (every rate, every seed) above the cap: a bug detector (the cap is
    a theorem), not evidence."""
    cap = single_head_cap()
    return sum(v > cap + 1e-6 for p in _rated(ONE_HEAD) for v in summary[p].values)


def can_part(
    name: str, witness: Callable[[], float], impossible: Callable[[], bool] | None = None
) -> Callable[[Summary], tuple[str, str]]:
    """The rule of a *can* part, established by construction: supported iff its witness
    passes :func:`acceptance` with accuracy 1 (``witness()`` ≥ :data:`SOLVED`); refuted iff
    ``impossible()`` (an impossibility argument computed in code; none is declared) says no
    parameters do; else inconclusive. Training is not consulted."""

    def rule(summary: Summary) -> tuple[str, str]:
        if witness() >= SOLVED:
            return "supported", f"{name} ✓"
        if impossible is not None and impossible():
            return "refuted", f"{name} ✗ (impossible)"
        return "inconclusive", f"{name} ? (witness not accepted)"

    return rule


def does_part(
    name: str, model: dict, reaches: Callable[[float], bool], need: int
) -> Callable[[Summary], tuple[str, str]]:
    """The rule of a *does* part on the trained seeds of ``model`` at every rate of
    :data:`RATES`: supported iff at some rate at least ``need`` seeds ``reaches``; refuted iff
    at every rate no seed does; else inconclusive."""

    def rule(summary: Summary) -> tuple[str, str]:
        counts = [sum(map(reaches, summary[p].values)) for p in _rated(model)]
        seeds = len(summary[_rated(model)[0]].values)
        best = max(range(len(RATES)), key=lambda i: counts[i])
        part = "supported" if counts[best] >= need else "refuted" if not any(counts) else (
            "inconclusive")  # fmt: skip
        mark = {"supported": "✓", "refuted": "✗", "inconclusive": "?"}[part]
        return part, (
            f"{name} {mark} ({counts[best]} of {seeds} seeds at lr {RATES[best]:g}; "
            f"{sum(counts)} of {seeds * len(RATES)} runs over the grid)"
        )

    return rule


def _reaches_cap(value: float) -> bool:
    return value >= single_head_cap() - 1e-6  # above it is a bug (above_cap), reported


def _solves(value: float) -> bool:
    return value >= SOLVED


CAN_RULES = {
    "2 heads": can_part("2 heads", witness_two_heads),
    "1 head + MLP": can_part("1 head + MLP", witness_mlp),
    "1 head + LayerNorm": can_part("1 head + LayerNorm", witness_layernorm),
}
DOES_RULES = {
    "1 head reaches the cap": does_part("1 head at cap", ONE_HEAD, _reaches_cap, need=5),
    "2 heads": does_part("2 heads", TWO_HEADS, _solves, need=3),
    "1 head + MLP": does_part("1 head + MLP", WITH_MLP, _solves, need=3),
    "1 head + LayerNorm": does_part("1 head + LayerNorm", WITH_LAYERNORM, _solves, need=3),
}


def verdict(summary: Summary) -> tuple[str, str]:
    """Declared before the rerun that publishes it (E2 redesign after review: can by
    construction, does by training on fresh seeds 5-9; seeds 0-4 were the pilot's). Accuracy
    is exact over the four inputs.

    *Cannot* (by construction, a :class:`Check`, not judged): one head without MLP or
    LayerNorm, with no positions, gets at most 3/4 (:func:`single_head_cap`, probed by
    :func:`cap_probe`). A trained one-head run above 3/4 at any rate would be a bug (the code
    is not the model of the theorem), not evidence: the reason reports the count of such runs
    (:func:`above_cap`, a bug detector like a :class:`Check`, not counted in the verdict).

    *Can* (by construction; a proof, not an experiment): two heads, one head + MLP, one head
    + LayerNorm. Each is supported iff its witness (hand-set parameters of the model the
    sweep trains at that point, built from ``get_experiment().base``) passes the acceptance
    criteria of :func:`acceptance`: accuracy 1; every |parameter| ≤ 100; every logit gap
    ≥ 0.1 and ≥ 2^10 float32 ulps (2^-13) of the largest |activation| of the forward pass;
    ≥ 95% of 200 N(0, 1e-3²) perturbations of every parameter still solve it. Refuted only by
    an impossibility computed in code (none declared); else inconclusive.

    *Does* (training, 2000 steps, batch 64, Adam, each rate of RATES = 0.001, 0.003, 0.01,
    0.03, 0.1 trained as its own point with seeds 5-9): 2 heads, 1 head + MLP, 1 head +
    LayerNorm each supported iff at some rate of the grid ≥ 3 of 5 seeds solve all four inputs;
    refuted iff 0 of 5 seeds solve it at every rate; else inconclusive. "1 head reaches the
    cap": supported iff at some rate all 5 seeds reach 3/4 (exactly 3/4 unless the bug
    detector fires); refuted iff no seed reaches it at any rate; else inconclusive. "At some
    rate" is what it says: valid and test are the same four inputs, so choosing a rate is
    choosing on the judged outcome; the rule counts seeds per rate and takes the best rate,
    i.e. it judges "training finds it at some rate of the declared grid", not "at a rate
    chosen beforehand".

    The claim's verdict combines every part (combine: refuted iff any part is, supported iff
    all are, else inconclusive). The can parts hold by construction, so the verdict is
    decided by the does parts: "refuted" means training (this grid, this budget) does not
    find a solution that exists, not that none exists. This is a change of reading from the
    first record (whose "refuted" read the LayerNorm training failure as "cannot")."""
    can = [rule(summary) for rule in CAN_RULES.values()]
    does = [rule(summary) for rule in DOES_RULES.values()]
    over = above_cap(summary)
    found = combine(v for v, _ in can + does)
    cans = sum(v == "supported" for v, _ in can)
    text = (
        f"can: {cans}/{len(can)} by construction ({', '.join(t for _, t in can)}; witnesses, "
        f"a proof, not an experiment); does (trained seeds 5-9, best rate of the grid): "
        f"{', '.join(t for _, t in does)}; cap check: {over} trained 1-head runs above 3/4"
        + (
            " (a BUG: the code is not the theorem's model; this record is not evidence)"
            if over
            else " (a bug detector, not counted)"
        )
        + ". Reading (changed from the first record): the can parts are established by "
        "construction, so this verdict is the does parts' — whether training finds the "
        "solutions, not whether they exist."
    )
    return found, text


PARTS = (
    Part("training reaches the 1-head cap 3/4 (all 5 seeds at some rate)", "does",
         rule=DOES_RULES["1 head reaches the cap"]),
    Part("2 heads can solve it", "can", rule=CAN_RULES["2 heads"], witness=witness_two_heads,
         bar=SOLVED),
    Part("1 head + MLP can solve it", "can", rule=CAN_RULES["1 head + MLP"],
         witness=witness_mlp, bar=SOLVED),
    Part("1 head + LayerNorm can solve it", "can", rule=CAN_RULES["1 head + LayerNorm"],
         witness=witness_layernorm, bar=SOLVED),
    Part("training solves it with 2 heads (≥ 3 of 5 seeds at some rate)", "does",
         rule=DOES_RULES["2 heads"]),
    Part("training solves it with 1 head + MLP (≥ 3 of 5 seeds at some rate)", "does",
         rule=DOES_RULES["1 head + MLP"]),
    Part("training solves it with 1 head + LayerNorm (≥ 3 of 5 seeds at some rate)", "does",
         rule=DOES_RULES["1 head + LayerNorm"]),
)  # fmt: skip

CHECKS = (
    Check("one-head cap 3/4 with no positions (theorem): count-only output and no random draw "
          "above the cap (256 draws)", cap_probe, kind="theorem"),
)  # fmt: skip


def get_experiment(smoke: bool = False) -> Experiment:
    base = load_file(_CONFIG).get_config("smoke" if smoke else None)
    return Experiment(
        name="xor_bits",
        claim_id="E2",
        claim=" ".join(__doc__.split()),
        base=with_overrides(base, {"train.seed": FIRST_SEED}),
        points=tuple(p for model in MODELS for p in _rated(model)),
        metric="accuracy",
        verdict=verdict,
        solved_at=SOLVED,
        checks=CHECKS,
        parts=PARTS,
        pilot_seeds=PILOT_SEEDS,
    )
