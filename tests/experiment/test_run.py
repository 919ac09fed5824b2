"""Run folders end to end on the smoke config: files, determinism, resume, vmap, load_run."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnjax import cli, tasks
from attnjax.experiment import (
    Runs,
    check_workdir,
    load_run,
    storage,
    train_and_evaluate,
    with_overrides,
)
from attnjax.experiment import trainer as streams
from attnjax.experiment.config import task_name
from attnjax.experiment.run import PATCH_BATCH
from attnjax.experiment.storage import read_csv, read_jsonl
from attnjax.experiment.trainer import get_trainer, run_key
from tests.cpu import subprocess_env

ROOT = pathlib.Path(__file__).parents[2]


WITH_DROPOUT = {"model.dropout": 0.3}  # every run test trains with dropout


@pytest.fixture(scope="module")
def dropout_config(smoke_config):
    return with_overrides(smoke_config, WITH_DROPOUT)


@pytest.fixture(scope="module")
def reference_run(dropout_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    rows = train_and_evaluate(dropout_config, out, num_seeds=2)
    return out, rows


def _train_losses(path, step):
    rows = read_jsonl(path / "metrics.jsonl")
    return {
        r["seed"]: r["value"]
        for r in rows
        if r["split"] == "train" and r["metric"] == "loss" and r["step"] == step
    }


def test_run_folder_contents(dropout_config, reference_run):
    out, rows = reference_run
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "metrics.jsonl", "results.csv", "report.md", "curves.png",
            "attention.png", "env.json", "checkpoints"} <= names  # fmt: skip
    assert "patching.png" not in names  # only with train.patching
    assert (out / "attention.png").stat().st_size > 10_000  # a rendered heatmap, not blank
    assert [r["seed"] for r in rows] == [0, 1]
    # a step's forward pass alone multiplies every parameter with every example at least once
    batch_size = dropout_config.train.batch_size
    assert rows[0]["flops_per_step"] > 2 * batch_size * rows[0]["params"] > 0
    assert 0 <= rows[0]["test_accuracy"] <= 1
    env = json.loads((out / "env.json").read_text())
    assert env["jax"] == jax.__version__ and env["device_count"] == jax.device_count()
    assert "mean ± 95% interval" in (out / "report.md").read_text()
    assert not any(p.suffix in (".pkl", ".pickle") for p in out.rglob("*"))


def test_rerun_reproduces_results_exactly(dropout_config, reference_run, tmp_path):
    train_and_evaluate(dropout_config, tmp_path, num_seeds=2)
    first = (reference_run[0] / "results.csv").read_text()
    assert (tmp_path / "results.csv").read_text() == first


def test_finished_run_invoked_again_rewrites_the_same_results(
    dropout_config, reference_run, tmp_path
):
    shutil.copytree(reference_run[0], tmp_path, dirs_exist_ok=True)
    (tmp_path / "results.csv").unlink()
    train_and_evaluate(dropout_config, tmp_path, num_seeds=2)
    first = (reference_run[0] / "results.csv").read_text()
    assert (tmp_path / "results.csv").read_text() == first


def test_resume_after_interruption_matches_uninterrupted(dropout_config, reference_run, tmp_path):
    def interrupt(step, total, loss):
        assert np.isfinite(loss)
        if step < total:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(dropout_config, tmp_path, num_seeds=2, progress=interrupt)
    assert not (tmp_path / "results.csv").exists()
    train_and_evaluate(dropout_config, tmp_path, num_seeds=2)
    assert read_csv(tmp_path / "results.csv") == read_csv(reference_run[0] / "results.csv")
    assert read_jsonl(tmp_path / "metrics.jsonl") == read_jsonl(reference_run[0] / "metrics.jsonl")


def test_vectorized_seeds_match_separate_runs(dropout_config, reference_run, tmp_path):
    alone = with_overrides(dropout_config, {"train.seed": 1})
    train_and_evaluate(alone, tmp_path, num_seeds=1)
    step = dropout_config.train.eval_every
    np.testing.assert_allclose(
        _train_losses(tmp_path, step)[1], _train_losses(reference_run[0], step)[1], rtol=1e-5
    )


def test_existing_folder_of_another_config_is_never_overwritten(dropout_config, reference_run):
    other = with_overrides(dropout_config, {"model.heads": 2})
    with pytest.raises(FileExistsError, match="overwrite"):
        train_and_evaluate(other, reference_run[0], num_seeds=2)


def test_a_folder_from_before_a_new_field_resumes_and_another_config_still_refuses(
    dropout_config, reference_run, tmp_path
):
    shutil.copy(reference_run[0] / "config.json", tmp_path / "config.json")
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["config"]["train"]["extrapolate"]  # written before the field existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    check_workdir(dropout_config, tmp_path, num_seeds=2)  # its default: the same config
    with pytest.raises(FileExistsError, match="another config"):
        check_workdir(with_overrides(dropout_config, {"train.steps": 40}), tmp_path,
                      num_seeds=2)  # fmt: skip


def test_load_run_restores_a_model_that_reproduces_the_final_metric(reference_run):
    out, rows = reference_run
    config, model, metrics = load_run(out, run=1)  # seed 1, trained with dropout 0.3
    assert config.model.dropout == 0.3
    batch = get_trainer(config).eval_batch(1, "test")
    measured = tasks.get("xor_relation").metrics(model(batch), batch)  # evaluation mode
    assert float(measured["accuracy"]) == rows[1]["test_accuracy"]
    np.testing.assert_allclose(float(measured["loss"]), rows[1]["test_loss"], atol=1e-6)
    assert metrics and {"seed", "step", "split", "metric", "value"} <= set(metrics[0])
    by_pair = load_run(out, run=(1, rows[1]["learning_rate"]))[1]  # the same run, by name
    np.testing.assert_array_equal(by_pair(batch), model(batch))


def test_dropout_masks_follow_seed_and_step_and_evaluation_is_deterministic(dropout_config):
    trainer = get_trainer(dropout_config)
    runs = Runs.grid([0], [1e-3])
    state, _ = trainer.init(runs)
    params, rest, _ = one_run = jax.tree.map(lambda x: x[0], state)
    batch = trainer.eval_batch(0, "valid")
    loss = jax.jit(trainer._loss)

    def at(seed, step):
        return float(loss(params, rest, batch, run_key(seed, streams.DROPOUT, step)))

    assert at(0, 0) == at(0, 0)  # a (seed, step) draws one mask
    assert len({at(0, 0), at(0, 1), at(1, 0)}) == 3  # other steps and seeds draw others
    # a training step uses the masks of its (seed, step) and the batch of its (seed, step)
    size, task_config = dropout_config.train.batch_size, dropout_config.task
    step_batch = trainer.task.generate(run_key(0, streams.DATA, 7), size, task_config)
    _, step_loss = jax.jit(trainer._step_one)(one_run, 1e-3, jnp.uint32(0), jnp.int32(7))
    expected = loss(params, rest, step_batch, run_key(0, streams.DROPOUT, 7))
    np.testing.assert_allclose(float(step_loss), float(expected), rtol=1e-6)

    first, second = trainer.evaluate(state, runs, "test"), trainer.evaluate(state, runs, "test")
    model = nnx.merge(trainer.graphdef, params, rest)
    model.eval()  # evaluation equals the model without dropout
    test_batch = trainer.eval_batch(0, "test")
    plain = trainer.task.metrics(model(test_batch), test_batch)
    for name, values in first.items():
        np.testing.assert_array_equal(values, second[name])
        np.testing.assert_allclose(values[0], plain[name], rtol=1e-6)


def test_each_seed_draws_its_own_evaluation_batches(smoke_config):
    trainer = get_trainer(smoke_config)
    inputs = {(s, split): np.asarray(trainer.eval_batch(s, split)["inputs"])
              for s in (0, 1) for split in ("valid", "test")}  # fmt: skip
    size = smoke_config.train.eval_batch_size
    train = np.asarray(
        trainer.task.generate(run_key(0, streams.DATA, 0), size, smoke_config.task)["inputs"]
    )
    draws = [*inputs.values(), train]
    assert all(not np.array_equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1 :])


def test_cli_run_with_set_override(tmp_path, capsys):
    cli.main([
        "run", str(ROOT / "configs" / "xor_relation.py"), "--smoke", "--seeds", "1",
        "--set", "model.score=additive", "--set", "model.causal=true", "--out", str(tmp_path),
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert "run folder" in captured.out
    config = json.loads((tmp_path / "config.json").read_text())["config"]["model"]
    assert config["score"] == "additive" and config["causal"] is True
    # not a terminal: plain progress lines with the step, the loss and the time left
    assert re.search(r"xor_relation  step 20/20  loss \d+\.\d{4}  \d+ s left", captured.err)


def test_progress_times_a_point_trained_again_on_its_own_clock(monkeypatch, capsys):
    # a resumed point finishes, then trains again (a grown rate grid) from step 0; 10 s a chunk
    now = [0.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: now[0])
    progress = cli.Progress(num_points=2)
    for step in (450, 600, 150, 300, 450, 600):
        progress("p", step, 600, 1.0)
        now[0] += 10
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].endswith("[1/2] p  step 600/600  loss 1.0000  0 s left")
    assert "s left" not in lines[2]  # its first chunk: no rate yet
    assert lines[3].endswith("step 300/600  loss 1.0000  20 s left")  # 10 s per 150 steps
    assert lines[5].startswith("[1/2] p  step 600/600")  # counted once among the points done


def test_progress_bars_count_a_point_trained_again_once(monkeypatch):
    monkeypatch.setattr(cli.rich.console.Console, "is_terminal", property(lambda _: True))
    with cli.Progress(num_points=2) as progress:
        for step in (300, 600, 300, 600):
            progress("p", step, 600, 1.0)
        assert progress.bars.tasks[progress.points].completed == 1 and not progress.tasks


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "model.sccore=dot"], "unknown field 'sccore' of model"),
        (["--set", "model.causal=maybe"], "--set model.causal: expected true or false"),
        (["--variant", "smoek"], "--variant: 'smoek' is not a variant of xor_relation.py; "
                                 "expected one of ['smoke']"),
    ],
)  # fmt: skip
def test_cli_usage_errors_are_one_line_with_status_2(tmp_path, capsys, args, message):
    command = ["run", str(ROOT / "configs" / "xor_relation.py"), "--out", str(tmp_path), *args]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(command)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("attnjax run: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(ValueError, match=r"sccore|maybe|smoek"):
        cli.main([*command, "--debug"])


def test_overwrite_removes_only_what_the_run_wrote(smoke_config, tmp_path, capsys):
    train_and_evaluate(smoke_config, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    other = ["--set", "model.heads=2", "--out", str(tmp_path)]
    command = ["run", str(ROOT / "configs" / "xor_relation.py"), "--smoke", *other]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(command)  # another config in the folder: refused before training
    assert exit_info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    cli.main([*command, "--overwrite"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert json.loads((tmp_path / "config.json").read_text())["config"]["model"]["heads"] == 2


def test_cli_sweep_applies_set_to_the_base_config(tmp_path, capsys):
    experiment = tmp_path / "tiny.py"
    experiment.write_text(
        "from attnjax.experiment import Experiment, load_file\n"
        f"base = load_file({str(ROOT / 'configs' / 'xor_relation.py')!r}).get_config('smoke')\n"
        "def get_experiment(smoke=False):\n"
        "    return Experiment(name='tiny', claim_id='T1', claim='a test', base=base,\n"
        "        points=({'model.heads': 1}, {'model.heads': 2}), metric='accuracy',\n"
        "        verdict=lambda summary: ('inconclusive', 'a test'))\n"
    )
    cli.main(["sweep", str(experiment), "--seeds", "1", "--out", str(tmp_path / "out"),
              "--set", "model.width=16", "--set", "model.heads=4"])  # fmt: skip
    folders = sorted((tmp_path / "out" / "points").iterdir())
    models = [json.loads((f / "config.json").read_text())["config"]["model"] for f in folders]
    assert [(m["width"], m["heads"]) for m in models] == [(16, 1), (16, 2)]  # points win
    assert re.search(r"\[2/2\] heads=\d  step 20/20  loss", capsys.readouterr().err)


def test_sharded_seeds_on_four_devices_match_one_device(reference_run, tmp_path):
    script = (
        "import jax, sys; assert jax.device_count() == 4\n"
        "from attnjax.experiment import load_file, train_and_evaluate, with_overrides\n"
        f"c = load_file({str(ROOT / 'configs' / 'xor_relation.py')!r}).get_config('smoke')\n"
        f"c = with_overrides(c, {WITH_DROPOUT!r})\n"
        f"train_and_evaluate(c, {str(tmp_path)!r}, num_seeds=4)\n"
    )
    env = subprocess_env(4)
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=ROOT)
    sharded = {int(r["seed"]): r for r in read_csv(tmp_path / "results.csv")}
    for row in read_csv(reference_run[0] / "results.csv"):
        np.testing.assert_allclose(
            float(sharded[int(row["seed"])]["test_loss"]), float(row["test_loss"]), rtol=1e-5
        )


def test_diagnostics_and_regularizers_are_recorded(smoke_config, tmp_path):
    config = with_overrides(
        smoke_config,
        {"model.heads": 2, "train.diagnostics": True, "train.diversity": "cosine",
         "train.diversity_weight": 0.1, "train.z_loss": 1e-4},
    )  # fmt: skip
    train_and_evaluate(config, tmp_path, num_seeds=1)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    recorded = {r["metric"] for r in rows if r["split"] == "test"}
    diagnostics = {"attention_entropy", "attention_saturation", "head_similarity"}
    diagnostics |= {"attention_max_logit", "attention_jacobian_norm", "attention_effective_rank"}
    assert diagnostics <= recorded
    values = {m: [r["value"] for r in rows if r["metric"] == m] for m in diagnostics}
    assert all(0 <= v <= 1 for v in values["attention_jacobian_norm"])
    assert all(
        1 - 1e-5 <= v <= smoke_config.task.spec.seq_len for v in values["attention_effective_rank"]
    )
    max_entropy = np.log(smoke_config.task.spec.seq_len) + 1e-6
    assert all(0 <= e <= max_entropy for e in values["attention_entropy"])


def test_runs_are_found_by_seed_and_learning_rate():
    runs = Runs.grid([3, 4], [1e-3, 1e-2])
    pairs = zip(runs.seeds, runs.learning_rates, strict=True)
    assert [runs.index(s, lr) for s, lr in pairs] == [0, 1, 2, 3]
    assert runs.index(4, 1e-3) == 1
    with pytest.raises(ValueError, match="no run of seed 5"):
        runs.index(5, 1e-3)


def _scalars(folder: pathlib.Path) -> dict[tuple[str, int], float]:
    """``{(tag, step): value}`` of the TensorBoard event files in ``folder`` (TFRecords of
    ``Event`` protos, read with tensorboardX's own proto)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        while data:
            length = int.from_bytes(data[:8], "little")
            event = event_pb2.Event.FromString(data[12 : 12 + length])
            data = data[16 + length :]
            for value in event.summary.value:
                scalars[(value.tag, event.step)] = value.simple_value
    return scalars


def test_tensorboard_scalars_attention_arrays_and_patching_tables(smoke_config, tmp_path):
    config = with_overrides(smoke_config, {"train.tensorboard": True, "train.patching": True})
    train_and_evaluate(config, tmp_path, num_seeds=2)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    for seed in (0, 1):
        lr = config.optim.learning_rate
        scalars = _scalars(tmp_path / "tensorboard" / f"seed={seed}_lr={lr:g}")
        rows = [r for r in metrics if r["seed"] == seed]
        assert len(scalars) == len(rows) > 0
        for r in rows:
            assert scalars[(f"{r['split']}/{r['metric']}", r["step"])] == pytest.approx(r["value"])
    arrays = np.load(tmp_path / "attention.npz")
    heads, length = config.model.heads, config.task.spec.seq_len
    assert sorted(arrays) == ["layer_0"] and arrays["layer_0"].shape == (heads, length, length)
    np.testing.assert_allclose(arrays["layer_0"].sum(-1), 1.0, atol=1e-5)
    # patching: the tables of run 0, their metrics recomputed from the restored model
    assert (tmp_path / "patching.png").stat().st_size > 10_000
    tables = np.load(tmp_path / "patching.npz")
    layers = config.model.layers
    assert tables["head_values"].shape == (layers, heads)
    assert tables["position_values"].shape == (layers, length)
    _, model, _ = load_run(tmp_path, run=0)
    task = tasks.get(task_name(config.task))
    batches = [task.generate(jax.random.key(i), PATCH_BATCH, config.task) for i in (0, 1)]
    clean, corrupted = (-task.loss(model(b), batches[0]) for b in batches)
    for over in ("head", "position"):
        np.testing.assert_allclose(tables[f"{over}_clean"], clean, rtol=1e-5)
        np.testing.assert_allclose(tables[f"{over}_corrupted"], corrupted, rtol=1e-5)
        normalized = (tables[f"{over}_raw"] - corrupted) / (clean - corrupted)
        np.testing.assert_allclose(tables[f"{over}_values"], normalized, rtol=1e-4, atol=1e-6)


ANALYSIS = (
    "from attnjax.experiment import Analysis, load_file, train_and_evaluate\n"
    f"base = load_file({str(ROOT / 'configs' / 'xor_relation.py')!r}).get_config('smoke')\n"
    "def analyze(out, smoke, *, seeds=None, overwrite=False):\n"
    "    rows = train_and_evaluate(base, out / 'train', num_seeds=seeds or 1,\n"
    "                              overwrite=overwrite)\n"
    "    return Analysis(rows, 'trained', {'T2': ('inconclusive', 'a test')})\n"
)


def test_analysis_experiments_take_seeds_overwrite_and_resume(tmp_path, capsys):
    experiment = tmp_path / "analysis.py"
    experiment.write_text(ANALYSIS)
    out = tmp_path / "out"
    command = ["sweep", str(experiment), "--out", str(out)]
    cli.main([*command, "--seeds", "2"])
    assert len(read_csv(out / "results.csv")) == 2
    checkpoint = sorted((out / "train" / "checkpoints").iterdir())
    cli.main([*command, "--seeds", "2"])  # the same runs: resumed, nothing retrained
    assert sorted((out / "train" / "checkpoints").iterdir()) == checkpoint
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--seeds", "3"])  # other runs in the folder
    assert exit_info.value.code == 2 and "--overwrite" in capsys.readouterr().err
    cli.main([*command, "--seeds", "3", "--overwrite"])
    assert len(read_csv(out / "results.csv")) == 3
    (tmp_path / "fixed.py").write_text(ANALYSIS.replace("*, seeds=None, ", "*, "))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", str(tmp_path / "fixed.py"), "--seeds", "2", "--out", str(out)])
    assert exit_info.value.code == 2 and "takes no seeds" in capsys.readouterr().err


def test_json_is_replaced_whole_and_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    storage.write_json(path, {"a": 1})
    storage.write_json(path, {"a": 2})
    assert storage.read_json(path) == {"a": 2}

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(storage.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        storage.write_json(path, {"a": 3})
    assert storage.read_json(path) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
