"""mqa_ordering (E5) design: the rank certificate and construction, the witnesses, the
capacity verdict (a witness refutes the "cannot"; a trained shortfall never supports it) and
each training reading's reachability (supported, refuted and inconclusive)."""

import pathlib

import numpy as np

from attnjax.experiment import Stats, Summary, load_file

ROOT = pathlib.Path(__file__).parents[2]
MODULE = load_file(ROOT / "experiments" / "mqa_ordering.py")


def test_the_certificate_proves_the_claims_orders_and_no_realizable_ones():
    m = MODULE
    assert m.unrealizable_below(((0, 1, 2), (2, 0, 1)))  # the claim's 1≻3≻2, 2≻1≻3 at d = 1
    assert not m.unrealizable_below(((0, 1, 2), (2, 1, 0)))  # an order and its reverse
    assert not m.unrealizable_below(((0, 1, 2, 3), (0, 1, 2, 3)))
    rng = np.random.default_rng(0)
    for _ in range(20):  # orders realized by keys of dimension 2 are never called impossible
        scores = rng.normal(size=(3, 2)) @ rng.normal(size=(16, 2)).T
        assert not m.unrealizable_below(tuple(tuple(np.argsort(-row)) for row in scores))
    assert m.impossibility_check() and m.construction_check()


def test_the_witnesses_solve_every_input_and_are_refused_where_impossible():
    m = MODULE
    for point in (m.MQA_3, m.MQA, m.MHA, m.MHA_R4, m.GQA_R4):
        assert m._witness_of(point)() == 1.0, point
    try:
        m.witness_model(m.MQA_R4)
    except ValueError as error:
        assert "orders per key group" in str(error)
    else:
        raise AssertionError("a witness for four orders on keys of dimension 2")


def _summary(values: dict) -> Summary:
    """8 seeds per point: ``values[name]`` for the named points, else solved."""
    solved = [1.0, 0.999, 1.0, 0.998, 1.0, 0.999, 1.0, 1.0]
    entries = []
    for point in MODULE.POINTS:
        seeds = next((v for name, v in values.items() if getattr(MODULE, name) == point), solved)
        entries.append((point, Stats(float(np.mean(seeds)), 0.0, tuple(seeds), 1e-2, 1)))
    return Summary(entries)


SHORT = [0.70, 0.75, 0.72, 0.78, 0.74, 0.71, 0.76, 0.73]
NOISY = [0.99, 0.80, 0.99, 0.85, 0.99, 0.99, 0.82, 0.99]


def test_a_trained_shortfall_never_supports_the_cannot(monkeypatch):
    summary = _summary({"MQA": SHORT, "MQA_3": SHORT})
    found, text = MODULE.verdict(summary)
    assert found == "refuted" and "witness solves every input" in text  # the witness decides
    monkeypatch.setattr(MODULE, "witness", lambda p: 0.0)  # without witnesses
    assert MODULE.verdict(summary)[0] == "inconclusive"  # still never supported
    found, text = MODULE.verdict(_summary({"MQA_3": SHORT}))  # still without witnesses
    assert found == "refuted" and "trained MQA matches" in text


def _each_way(rule, supported: dict, refuted: dict, inconclusive: dict):
    assert [rule(_summary(v))[0] for v in (supported, refuted, inconclusive)] == [
        "supported", "refuted", "inconclusive"]  # fmt: skip


def test_every_training_reading_can_come_out_each_way():
    m, unsolved = MODULE, {"MHA": SHORT, "MHA_3": SHORT, "MHA_R4": SHORT, "MHA_D1": SHORT}
    for name, mqa in (("two orders, 16 items", "MQA"), ("the claim's 3 items", "MQA_3")):
        _each_way(m.TRAINED[name], {mqa: SHORT}, {}, {mqa: NOISY})
    for name, mqa in (("four orders, d = 2", "MQA_R4"), ("two orders, d = 1", "MQA_D1"),
                      ("two orders, d = 1, the claim's 3 items", "MQA_D1_3")):  # fmt: skip
        _each_way(m.NARROWED[name], {mqa: SHORT}, {}, {mqa: NOISY})
    for name, gqa, mqa in (("GQA between, four orders, d = 2", "GQA_R4", "MQA_R4"),
                           ("GQA between, two orders, d = 1", "GQA_D1", "MQA_D1")):  # fmt: skip
        _each_way(m.NARROWED[name], {mqa: SHORT}, {}, {mqa: NOISY})  # refuted: GQA = MQA
        for failed in (unsolved, {gqa: SHORT}):  # GQA has the capacity: failing is no evidence
            assert m.NARROWED[name](_summary(failed | {mqa: SHORT}))[0] == "inconclusive"
    assert m.TRAINED["two orders, 16 items"](_summary(unsolved))[0] == "inconclusive"
    _, text = m.verdict(_summary({"MQA_R4": SHORT, "MQA_D1": SHORT, "MQA_D1_3": SHORT}))
    assert f"Narrowed, trained (R > d; {m.BUDGET}; the certificate" in text
    assert "accuracy): supported" in text
