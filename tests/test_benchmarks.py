"""The README's benchmark commands run (on tiny sizes; the timings themselves are not tests)."""

import pathlib
import subprocess
import sys

from tests.cpu import FAST_COMPILE

ROOT = pathlib.Path(__file__).parents[1]


def _run(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "", "XLA_FLAGS": FAST_COMPILE},
    )  # fmt: skip
    return result.stdout


def test_attention_benchmark_prints_its_table():
    printed = _run("benchmarks/attention.py", "--lengths", "64", "--repeats", "1",
                   "--causal", "0", "--additive-max-length", "64")  # fmt: skip
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "64" in line]
    names = [row.split("|")[1].strip() for row in rows]
    assert names == ["jax.nn", "chunked", "additive dense", "additive chunked"] * 2
    errors = [float(row.split("|")[-2]) for row in rows]
    assert max(errors) < 1e-4  # every row agrees with its baseline


def test_gpu_script_names_existing_files():
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert "tests/test_pallas_gpu.py" in script and (ROOT / "tests/test_pallas_gpu.py").is_file()
    assert "benchmarks/attention.py" in script


def test_tpu_script_names_existing_files():
    script = (ROOT / "benchmarks" / "tpu.sh").read_text()
    assert "tests/test_pallas_tpu.py" in script and (ROOT / "tests/test_pallas_tpu.py").is_file()
    assert "benchmarks/attention.py" in script and '"jax splash"' in script


def test_nonfinite_benchmark_prints_its_ratios():
    printed = _run("benchmarks/nonfinite.py", "--length", "32", "--repeats", "1")
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| ")]
    assert [(r[1].strip(), r[2].strip()) for r in rows[1:]] == [("xla", "32"), ("chunked", "128")]
    assert all(float(r[5]) > 0 for r in rows[1:])


def test_hooks_benchmark_prints_a_ratio_per_call():
    printed = _run("benchmarks/hooks.py", "--length", "32", "--layers", "1", "--repeats", "1")
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == ["xla"] * 5 + ["chunked"] * 5
    assert all(float(r[4]) > 0 for r in rows[1:])
    outputs = {r[2].strip(): float(r[5]) for r in rows[1:6]}  # caching more keeps more
    assert outputs["plain forward"] < outputs["cache *.attention.z"] < outputs["cache every point"]
