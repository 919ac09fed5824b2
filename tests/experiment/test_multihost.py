"""Runs across two processes on JAX's distributed runtime (CPU, localhost) equal a
one-process run on two devices, bit for bit; only process 0 writes; a rerun restores the
checkpoint across processes."""

import os
import pathlib
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
SCRIPT = """
import sys, jax
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if process >= 0:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process)
from attnjax.experiment import load_file, train_and_evaluate
config = load_file(sys.argv[4]).get_config("smoke")
rows = train_and_evaluate(config, out, num_seeds=2)
print("test accuracy", [r["test_accuracy"] for r in rows])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(process: int, port: int, out: pathlib.Path, env: dict) -> subprocess.Popen:
    config = str(ROOT / "configs" / "xor_relation.py")
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(process), str(port), str(out), config],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _two_processes(out: pathlib.Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": ""}
    port = _free_port()
    procs = [_launch(i, port, out, env) for i in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    return [line for o in outputs for line in o.splitlines() if line.startswith("test accuracy")]


def test_two_processes_equal_one_process_on_two_devices(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # fmt: skip
    one = _launch(-1, 0, tmp_path / "one", env)
    assert one.wait(timeout=300) == 0, one.stdout.read()
    printed = _two_processes(tmp_path / "two")
    assert len(printed) == 2 and printed[0] == printed[1]  # every process sees every run
    for name in ("results.csv", "metrics.jsonl"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert _two_processes(tmp_path / "two") == printed  # restored across processes
