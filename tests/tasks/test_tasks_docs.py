"""docs/tasks.md: generated from the registry by docs/tasks.py, current, every task listed."""

import importlib.util
import pathlib
import re

from attnjax import tasks

DOCS = pathlib.Path(__file__).parents[2] / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_tasks", DOCS / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tasks_page_is_current():
    assert (DOCS / "tasks.md").read_text() == _generator().render(), "run python docs/tasks.py"


def test_tasks_page_lists_every_task_with_its_next_token_flag():
    text = (DOCS / "tasks.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (yes|no) \|", text, re.MULTILINE))
    assert rows == {name: "yes" if tasks.get(name).next_token else "no" for name in tasks.names()}
    assert rows["markov"] == "yes" and rows["copy"] == "no"
    for name in tasks.names():
        assert f"\n## `{name}`\n" in text
