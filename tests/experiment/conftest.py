import pathlib

import pytest

from attnjax.experiment import load_file


@pytest.fixture(scope="session")
def smoke_config():
    """The XOR relation config's seconds-long variant (20 steps, 2 evaluations)."""
    return load_file(pathlib.Path(__file__).parents[2] / "configs" / "xor_relation.py").get_config(
        "smoke"
    )
