"""The dot-vs-general (S3), cosine-bound (S4) and entropy-collapse (S9) experiments: their
measurements and rules on constructed inputs, and their smoke variants end to end through
``attnjax sweep``."""

import pytest

from tests.experiment.conftest import smoke_verdicts

RECORDS = {
    "cosine_bound": (["S4"], ["summary.png"]),
    "entropy_collapse": (["S9"], ["summary.png"]),
    "luong_scores": (["S3"], ["summary.png"]),
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_smoke_end_to_end(name, run_smoke):
    claims, figures = RECORDS[name]
    assert smoke_verdicts(run_smoke, name, figures) == (claims, claims)
