"""CLAIMS E5: multi-query attention (keys and values shared by all heads) cannot realize two
different key orderings (1≻3≻2 and 2≻1≻3) that multi-head attention can; grouped-query
attention lies in between. The limit needs a key dimension below the number of orders, so
heads have size 1: shared one-dimensional keys allow only one order and its reverse. A
control gives MQA heads of size 2, enough for both orders."""

from pathlib import Path

from attnjax.experiment import Experiment, Summary, load_file

_CONFIG = Path(__file__).parents[1] / "configs" / "mqa_ordering.py"
SOLVED = 0.9
MHA = {"model.heads": 8, "model.kv_heads": 8}  # head size 1
GQA = {"model.heads": 8, "model.kv_heads": 2}  # 2 key groups
MQA = {"model.heads": 8, "model.kv_heads": 1}
CONTROL = {"model.heads": 4, "model.kv_heads": 1}  # MQA, head size 2


def verdict(summary: Summary) -> tuple[str, str]:
    """Supported iff MHA reaches ``SOLVED`` (mean) and MQA with head size 1 lies below it
    (interval upper end below MHA's lower end). Refuted iff MQA's mean reaches MHA's lower
    end. GQA and the control are reported."""
    mha, gqa, mqa, control = (summary[p] for p in (MHA, GQA, MQA, CONTROL))
    detail = (
        f"MHA {mha.mean:.3f}, GQA (2 groups) {gqa.mean:.3f}, MQA {mqa.mean:.3f} "
        f"(head size 1); MQA with head size 2: {control.mean:.3f}."
    )
    if mqa.mean >= mha.lower:
        return "refuted", detail
    if mha.mean >= SOLVED and mqa.upper < mha.lower:
        return "supported", detail
    return "inconclusive", detail


def get_experiment(smoke: bool = False) -> Experiment:
    return Experiment(
        name="mqa_ordering",
        claim_id="E5",
        claim=" ".join(__doc__.split()),
        base=load_file(_CONFIG).get_config("smoke" if smoke else None),
        points=(MHA, GQA, MQA, CONTROL),
        metric="accuracy",
        verdict=verdict,
        learning_rates=(3e-3, 1e-2, 3e-2),
        solved_at=SOLVED,
    )
