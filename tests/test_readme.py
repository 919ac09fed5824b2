"""The README's example code and the main job's command run as documented."""

import pathlib
import re

from attnjax import cli

ROOT = pathlib.Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    out = ("out", (2, 128, 8, 64))
    logits = ("logits", (8, 16, 10))
    patterns = ("patterns", (2, 8, 4, 16, 16))
    expected = [out, out, out, ("out", (2, 16, 64)), logits, logits, patterns]
    assert len(blocks) == len(expected)
    namespace = {}  # the blocks build on each other, as a reader runs them
    for block, (name, shape) in zip(blocks, expected, strict=True):
        exec(block, namespace)
        assert namespace[name].shape == shape


def test_readme_commands_name_existing_files():
    for command in re.findall(r"^attnjax (?:run|sweep) (\S+)", README, re.M):
        assert (ROOT / command).is_file(), command
    assert "attnjax sweep experiments/xor_relation.py" in README


def test_demo_command_is_documented_and_runs(capsys):
    assert "attnjax demo" in README
    cli.main(["demo"])
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines() if line.strip()[:1].isdigit()]
    var_dot = {int(r[0]): float(r[1]) for r in rows if len(r) == 7}
    assert abs(var_dot[1024] / 1024 - 1) < 0.1 and abs(var_dot[4] / 4 - 1) < 0.1
    assert "max |difference|" in printed
