"""The power of the atlas's tie rule (A2, A3) as its docstring declares it, recomputed: a Monte
Carlo of 300 atlases per setting, no true difference between the scores, from a fixed key.
It calls the rule's helpers millions of times without jaxtyping's runtime checks, which bind
every call's arguments (most of the test's time) and are exercised by the other atlas tests."""

import pathlib
import re

import jaxtyping
import numpy as np

from attnjax.experiment import load_file
from tests.experiment.test_atlas import _cell

ROOT = pathlib.Path(__file__).parents[2]
ATLAS = load_file(ROOT / "experiments" / "atlas.py")
CLAIMS = ATLAS._claims(ATLAS.columns())  # A2's and A3's columns, scores and settings
ATLASES, SPREADS = 300, (0.05, 0.1, 0.15, 0.2)


def _seeds(values: np.ndarray):
    """A cell of these per-seed accuracies."""
    return _cell(tuple(float(v) for v in values))


def _atlas(claim: str, rng: np.random.Generator, sd: float, bimodal: bool) -> tuple[str, bool]:
    """One simulated atlas of ``claim``'s cells: its verdict and whether the screen flagged.
    scaled_dot's seeds lie around 0.7 (spread 0.1), every other score's at scaled_dot's plus
    a difference of spread ``sd``; ``bimodal``: every score solves each seed (1.0) with
    probability 1/2, else 0.3."""
    cols, scores, settings = CLAIMS[claim]
    found = {}
    for c in cols:
        for setting in settings:
            if bimodal:
                for s in ("scaled_dot", *scores):
                    found[(c.name, s, *setting)] = _seeds(np.where(rng.random(5) < 0.5, 1.0, 0.3))
                continue
            base = 0.7 + rng.normal(0, 0.1, ATLAS.SEEDS)
            found[(c.name, "scaled_dot", *setting)] = _seeds(base)
            for s in scores:
                found[(c.name, s, *setting)] = _seeds(base + rng.normal(0, sd, ATLAS.SEEDS))
    verdict, reason = ATLAS.ties(found, cols, scores, settings)
    return verdict, re.search(r"flagged beyond [^:]*: (\d+),", reason)[1] != "0"


def _shares(claim: str, sd: float, bimodal: bool = False) -> tuple[int, int]:
    """Percent of ``ATLASES`` atlases supported and flagged."""
    rng = np.random.default_rng(1)
    out = [_atlas(claim, rng, sd, bimodal) for _ in range(ATLASES)]
    supported = sum(v == "supported" for v, _ in out)
    flagged = sum(f for _, f in out)
    return round(100 * supported / ATLASES), round(100 * flagged / ATLASES)


def test_the_declared_power_of_the_tie_rule_is_the_monte_carlos(monkeypatch):
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)
    shares = {c: {sd: _shares(c, sd) for sd in SPREADS} | {"bimodal": _shares(c, 0.0, True)}
              for c in ("A2", "A3")}  # fmt: skip

    def listed(claim: str, which: int, spreads) -> str:
        values = [f"{shares[claim][sd][which]}%" for sd in spreads]
        return f"{', '.join(values[:-1])} and {values[-1]}"

    declared = " ".join(ATLAS.__doc__.split())
    supported = (f"A2 comes out supported in {listed('A2', 0, SPREADS[:3])} of atlases at sd "
                 f"0.05, 0.1 and 0.15, A3 in {listed('A3', 0, SPREADS[:3])}")  # fmt: skip
    flagged = (f"flags something (and calls for confirmation runs) in "
               f"{listed('A2', 1, SPREADS[1:])} (A2) and {listed('A3', 1, SPREADS[1:])} (A3) of "
               f"atlases at sd 0.1, 0.15 and 0.2, and in {shares['A2']['bimodal'][1]}% and "
               f"{shares['A3']['bimodal'][1]}% "
               f"where each score solves each seed with probability 1/2")  # fmt: skip
    screened = [f for c in shares.values() for k, (_, f) in c.items() if k != 0.05]
    assert supported in declared
    assert flagged in declared
    assert f"flags something in {min(screened)}-{max(screened)}% of atlases" in declared
