"""Runs across two processes on JAX's distributed runtime (CPU, localhost) equal a
one-process run on two devices, bit for bit; only process 0 writes and prints progress; a
rerun restores the checkpoint across processes."""

import pathlib
import socket
import subprocess
import sys

from tests.cpu import subprocess_env

ROOT = pathlib.Path(__file__).parents[2]
CONFIG = str(ROOT / "configs" / "xor_relation.py")
SCRIPT = """
import sys, jax
process, port, out, cli = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "cli"
if process >= 0:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process)
from attnjax.cli import main
from attnjax.experiment import load_file, train_and_evaluate
if cli:  # the README's command
    main(["run", sys.argv[5], "--smoke", "--seeds", "2", "--out", out])
else:
    config = load_file(sys.argv[5]).get_config("smoke")
    rows = train_and_evaluate(config, out, num_seeds=2)
    print("test accuracy", [r["test_accuracy"] for r in rows])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(process: int, port: int, out: pathlib.Path, env: dict, how: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(process), str(port), str(out), how, CONFIG],
        env=env | {"ATTNJAX_COMPILE_CACHE": "0"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _two_processes(out: pathlib.Path, how: str) -> list[tuple[str, str]]:
    """Each process's ``(stdout, stderr)``."""
    env = subprocess_env(PYTHONPATH=str(ROOT))
    port = _free_port()
    procs = [_launch(i, port, out, env, how) for i in (0, 1)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    return outputs


def _without_gloo(stdout: str) -> list[str]:
    """The lines of ``stdout`` but Gloo's: JAX's CPU collectives (Gloo, C++) print one
    ``[Gloo] Rank <i> is connected to 1 peer ranks. ...`` line per process as they connect;
    nothing in Python can filter it."""
    return [line for line in stdout.splitlines() if not line.startswith("[Gloo] ")]


def _accuracies(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("test accuracy")]


def test_two_processes_equal_one_process_on_two_devices(tmp_path):
    env = subprocess_env(2, PYTHONPATH=str(ROOT))
    one = _launch(-1, 0, tmp_path / "one", env, "library")
    stdout, stderr = one.communicate(timeout=300)
    assert one.returncode == 0, stderr
    (first, progress), (second, quiet) = _two_processes(tmp_path / "two", "cli")
    assert "run folder" in first and "step 20/20" in progress  # process 0 reports
    assert _without_gloo(second) == [] and "step" not in quiet  # process 1 stays quiet
    for name in ("results.csv", "metrics.jsonl"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    rerun = [_accuracies(out) for out, _ in _two_processes(tmp_path / "two", "library")]
    assert rerun == [_accuracies(stdout)] * 2  # restored; every process sees every run
