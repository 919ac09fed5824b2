"""CLAIMS E2: one attention head cannot compute XOR of two bits (its output is a convex
combination of values, so a linear readout is a threshold of a sum of per-bit terms: at most 3
of the 4 inputs right, 75%); two heads can. An MLP or a LayerNorm after attention lets one
head solve it. Every run is evaluated on the four inputs once each, so accuracy is exact (0,
1/4, 1/2, 3/4 or 1) and the cap is exactly 3/4."""

from pathlib import Path

from attnjax import tasks
from attnjax.experiment import Experiment, Stats, Summary, combine, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "xor_bits.py"
SOLVED = 1.0  # all four inputs right
ONE_HEAD = {"model.heads": 1, "model.mlp": False, "model.norms": False}
TWO_HEADS = ONE_HEAD | {"model.heads": 2}
WITH_MLP = ONE_HEAD | {"model.mlp": True}
WITH_LAYERNORM = ONE_HEAD | {"model.norms": True}


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


def _can(name: str, stats: Stats) -> tuple[str, str]:
    """ "Can solve": supported iff most seeds reach every input right, refuted iff none does."""
    k, n = stats.solved(SOLVED), len(stats.values)
    part = "supported" if 2 * k > n else "refuted" if k == 0 else "inconclusive"
    return part, f"{name}: {k} of {n} seeds solve all four inputs ({part})"


def verdict(summary: Summary) -> tuple[str, str]:
    """Four parts, each judged on exact accuracies over the four inputs. (1) One head without
    MLP or LayerNorm: supported iff every seed stays at or below the cap (3/4), refuted iff any
    seed exceeds it. (2) Two heads, (3) one head + MLP, (4) one head + LayerNorm: each supported
    iff most seeds reach 1.0, refuted iff no seed does. The claim is supported iff all four
    parts are, refuted iff any part is, else inconclusive."""
    cap = single_head_cap()
    one = summary[ONE_HEAD]
    over = sum(v > cap + 1e-6 for v in one.values)
    first = "refuted" if over else "supported"
    parts = [(first, f"1 head: best seed {max(one.values):.2f}, {over} of {len(one.values)} "
                     f"seeds above the cap {cap:.2f} ({first})")]  # fmt: skip
    others = {"2 heads": TWO_HEADS, "1 head + MLP": WITH_MLP, "1 head + LayerNorm": WITH_LAYERNORM}
    parts += [_can(name, summary[point]) for name, point in others.items()]
    return combine(v for v, _ in parts), "; ".join(text for _, text in parts) + "."


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="xor_bits",
        claim_id="E2",
        claim=" ".join(__doc__.split()),
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=(ONE_HEAD, TWO_HEADS, WITH_MLP, WITH_LAYERNORM),
        metric="accuracy",
        verdict=verdict,
        learning_rates=(3e-3, 1e-2, 3e-2),
        solved_at=SOLVED,
    )
