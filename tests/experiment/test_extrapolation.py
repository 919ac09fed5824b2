"""The length-extrapolation split (``train.extrapolate``): a third evaluation, ``longer``, at a
multiple of the training length, on keys of its own, beside ``valid`` and ``test`` and outside
training; factor 1 leaves runs as they were."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax import tasks
from attnjax.experiment import (
    ExperimentConfig,
    OptimConfig,
    TrainConfig,
    load_run,
    report,
    storage,
    train_and_evaluate,
    with_overrides,
)
from attnjax.experiment.sweep import _column_order
from attnjax.experiment.trainer import DATA, EVAL, EVAL_SPLITS, Runs, get_trainer, run_key

RECALL = tasks.get("in_context_recall")
CONFIG = ExperimentConfig(
    name="extrapolation",
    task=RECALL.config(seq_len=16),
    model=dict(kind="transformer", width=16, layers=1, heads=1, positional="rope", causal=True),
    optim=OptimConfig(learning_rate=3e-3),
    train=TrainConfig(
        steps=20, eval_every=10, batch_size=16, eval_batch_size=64, fast_compile=True,
        extrapolate=2,
    ),
)  # fmt: skip
METRICS = ("accuracy", "loss")


@pytest.fixture(scope="module")
def extrapolated(tmp_path_factory):
    """``(folder, rows)`` of the config trained on two seeds."""
    folder = tmp_path_factory.mktemp("extrapolation")
    return folder, train_and_evaluate(CONFIG, folder, num_seeds=2)


def test_rows_log_and_report_carry_the_longer_split(extrapolated):
    folder, rows = extrapolated
    columns = {f"{split}_{m}" for split in ("valid", "test", "longer") for m in METRICS}
    assert set(rows[0]) == {"seed", "learning_rate", "params", "flops_per_step"} | columns
    logged = storage.read_jsonl(folder / "metrics.jsonl")
    longer = {(m["step"], m["seed"], m["metric"]) for m in logged if m["split"] == "longer"}
    assert longer == {(step, seed, m) for step in (10, 20) for seed in (0, 1) for m in METRICS}
    assert "| longer_accuracy |" in (folder / "report.md").read_text()
    fig = report.plot_curves(logged, folder / "curves.png", "extrapolation")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["train loss", "test accuracy", "longer loss", "longer accuracy"]
    table = _column_order([{"point": "p", **r, "chosen": True} for r in rows])
    metrics = [k for k in table[0] if k.split("_")[0] in ("valid", "test", "longer")]
    assert metrics == [f"{s}_{m}" for s in ("valid", "test", "longer") for m in METRICS]


def test_factor_one_evaluates_valid_and_test_only_with_the_same_numbers(extrapolated):
    folder, rows = extrapolated
    plain = get_trainer(with_overrides(CONFIG, {"train.extrapolate": 1}))
    assert list(plain.splits) == ["valid", "test"] and len(plain._evals) == 1  # one program
    runs = Runs.grid([0, 1], [CONFIG.optim.learning_rate])
    checkpoints = storage.Checkpoints(folder / "checkpoints")
    state = checkpoints.restore(plain.init(runs)[0])
    checkpoints.close()
    for split in plain.splits:
        for name, values in plain.evaluate(state, runs, split).items():
            assert values.tolist() == [r[f"{split}_{name}"] for r in rows]


def test_longer_batch_is_twice_the_length_on_keys_of_its_own():
    trainer = get_trainer(CONFIG)
    task = dataclasses.replace(CONFIG.task, seq_len=32)
    keys = [run_key(0, EVAL, i) for i in EVAL_SPLITS.values()] + [run_key(0, DATA, 0)]

    @jax.jit  # one program: eager draws compile each operation
    def draws():
        others = jax.vmap(lambda key: RECALL.generate(key, 64, task)["inputs"])(jnp.stack(keys))
        batches = (trainer.eval_batch(0, split)["inputs"] for split in ("longer", "test"))
        return *batches, others

    longer, test, others = draws()
    assert longer.shape == (64, 32) and test.shape == (64, 16)
    for other in others:  # drawn with valid's, test's and the first training step's keys
        assert not np.array_equal(other, longer)
    with pytest.raises(ValueError, match="split: expected one of"):
        get_trainer(with_overrides(CONFIG, {"train.extrapolate": 1})).eval_batch(0, "longer")


def test_row_longer_metrics_are_the_restored_model_on_the_longer_batch(extrapolated):
    folder, rows = extrapolated
    _, model, _ = load_run(folder, run=0)

    @jax.jit
    def measure():
        # the longer split's key, derived here: fold_in(fold_in(key(seed 0), EVAL=2), 3)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 2), 3)
        batch = RECALL.generate(key, 64, RECALL.config(seq_len=32))
        return RECALL.metrics(model(batch), batch)

    measured = measure()
    assert float(measured["accuracy"]) == rows[0]["longer_accuracy"]
    np.testing.assert_allclose(float(measured["loss"]), rows[0]["longer_loss"], rtol=1e-6)


def variant(task=None, **dotted):
    """A builder of ``CONFIG`` with another task and dotted overrides (``model__max_len``)."""
    overrides = {k.replace("__", "."): v for k, v in dotted.items()}
    return lambda: with_overrides(dataclasses.replace(CONFIG, task=task or CONFIG.task), overrides)


@pytest.mark.parametrize(
    "build, error, message",
    [
        (variant(tasks.get("copy").config()), ValueError,
         r"extrapolate=2: task 'copy' has no longer split: .* no seq_len"),
        (variant(tasks.get("xor_bits").config()), ValueError,
         r"extrapolate=2: task 'xor_bits' is evaluated on all its examples"),
        (variant(model__positional="learned", model__max_len=31), ValueError,
         r"extrapolate=2: task 'in_context_recall' at seq_len 32 exceeds the learned "
         r"positional table \(model.max_len=31\)"),
        (variant(train__extrapolate=0), ValueError, r"TrainConfig.extrapolate: expected >= 1"),
        (variant(train__extrapolate=2.0), TypeError, "extrapolate"),
        (variant(train__extrapolate=True), TypeError, "extrapolate"),
    ],
)  # fmt: skip
def test_an_extrapolation_that_cannot_work_is_refused_when_the_config_is_built(
    build, error, message
):
    with pytest.raises(error, match=message):
        build()


def test_learned_positions_covering_the_longer_length_are_accepted():
    config = variant(model__positional="learned", model__max_len=32)()
    assert get_trainer(config).splits["longer"][1].seq_len == 32


def test_evaluating_many_runs_takes_the_memory_of_one():
    """The dense additive score holds ``[B, T, S, A]`` per run (64·32·32·16 floats on the
    longer split here); the runs are evaluated one after another, so 8 runs' evaluation
    program needs about one run's scratch memory, not 8 times it (38 MB when vectorized)."""
    trainer = get_trainer(with_overrides(CONFIG, {"model.score": "additive"}))
    split_id, task_config = trainer.splits["longer"]
    program = trainer._evals[task_config]

    def scratch(runs: int) -> int:
        seeds = jax.ShapeDtypeStruct((runs,), jnp.uint32)
        state = jax.eval_shape(trainer._init, seeds)
        lowered = program.lower(state.params, state.rest, seeds, jnp.uint32(split_id))
        return lowered.compile().memory_analysis().temp_size_in_bytes

    one, many = scratch(1), scratch(8)
    assert one >= 64 * 32 * 32 * 16 * 4  # the hidden features are held
    assert many < 1.5 * one, (one, many)
