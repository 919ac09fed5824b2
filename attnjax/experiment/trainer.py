"""Training many runs of one config at once: ``vmap`` over (seed, learning rate) runs,
``lax.scan`` over the steps between evaluations, the run axis sharded across devices.

Every run's state is a pytree with a leading run axis ``R``. A run's data stream depends only
on its seed, so runs of one seed at different learning rates see the same batches, and a run
gives the same numbers whether it trains alone or vectorized with others.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from attnjax import analysis, nn, tasks
from attnjax.experiment.config import ExperimentConfig, OptimConfig, longer_task, task_name

# Every random stream of a run derives from its seed: fold_in(key(seed), stream), then the
# step (training data, dropout) or the split (evaluation batches).
DATA, INIT, EVAL, DROPOUT = range(4)
# The evaluation splits at the training length, and the id of ``longer`` (``train.extrapolate``
# times the training length), evaluated only when that factor is > 1.
EVAL_SPLITS = {"valid": 1, "test": 2}
LONGER = 3


def param_count(build: Callable[[], nnx.Module]) -> int:
    """Parameters of the model ``build()`` makes (shapes only, nothing is initialized)."""
    model = nnx.eval_shape(build)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def run_key(seed: Array | int, stream: int, index: Array | int) -> Array:
    """``fold_in(fold_in(key(seed), stream), index)``: the key of ``stream``'s ``index``-th
    draw (a step or a split) in the runs of ``seed``."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), stream), index)


# XLA backend optimization levels (CPU, XOR model, 150 steps of 9 runs): level 0 compiles in a
# third of the default level's (3) time and runs 2-4x slower; level 1 compiles in half the
# time and runs as fast.
QUICK, OPTIMIZED = ({"xla_backend_optimization_level": level} for level in (0, 1))


@dataclasses.dataclass(frozen=True)
class Runs:
    """The runs trained together: ``seeds[r]`` and ``learning_rates[r]`` for ``r < R``."""

    seeds: tuple[int, ...]
    learning_rates: tuple[float, ...]

    @classmethod
    def grid(cls, seeds: Sequence[int], learning_rates: Sequence[float]) -> "Runs":
        pairs = [(s, lr) for lr in learning_rates for s in seeds]
        return cls(tuple(int(s) for s, _ in pairs), tuple(float(lr) for _, lr in pairs))

    def __len__(self) -> int:
        return len(self.seeds)

    def index(self, seed: int, learning_rate: float) -> int:
        """The position of the run of ``seed`` at ``learning_rate``."""
        pairs = list(zip(self.seeds, self.learning_rates, strict=True))
        if (seed, learning_rate) not in pairs:
            raise ValueError(f"no run of seed {seed} at learning rate {learning_rate:g}: {pairs}")
        return pairs.index((seed, learning_rate))


def optimizer(optim: OptimConfig, steps: int) -> optax.GradientTransformation:
    """AdamW (or SGD) *without* the learning rate, which each run multiplies in itself: the
    schedule (warm-up, then constant or cosine) is applied here as a factor in [0, 1]. Weight
    decay applies to parameters of rank >= 2 only (one run's parameters: the optimizer runs
    inside the vmap over runs) unless ``optim.decay_all``."""
    warmup = max(optim.warmup_steps, 1)
    if optim.schedule == "cosine":
        decay = optax.cosine_decay_schedule(1.0, max(steps - optim.warmup_steps, 1))
    else:
        decay = optax.constant_schedule(1.0)
    schedule = optax.join_schedules(
        [optax.linear_schedule(1.0 / warmup, 1.0, warmup), decay], [optim.warmup_steps]
    )
    parts = [optax.clip_by_global_norm(optim.clip_norm)] if optim.clip_norm else []
    if optim.optimizer == "adamw":
        parts.append(optax.scale_by_adam(b1=optim.b1, b2=optim.b2))
    return optax.chain(
        *parts,
        optax.add_decayed_weights(optim.weight_decay, mask=None if optim.decay_all else _matrices),
        optax.scale_by_schedule(lambda count: -schedule(count)),
    )


def _matrices(params: Any) -> Any:
    """True for parameters of rank >= 2 (kernels, embeddings, score matrices): weight decay
    leaves norms, biases and per-head vectors alone."""
    return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)


class TrainState(NamedTuple):
    """The state of every run, each leaf with a leading run axis: the model's ``nnx.Param``
    state, the rest of its state (buffers, gates, RNG counters) and the optimizer's state."""

    params: Any
    rest: Any
    opt_state: Any


class Trainer:
    """Compiled init, training chunk and evaluation for one :class:`ExperimentConfig`: it
    computes, and stores nothing (:func:`attnjax.experiment.train_and_evaluate` keeps the run
    folder). States are :class:`TrainState` s with a leading run axis. ``splits`` maps each
    evaluation split to its id and task config: ``valid`` and ``test`` at the training
    length, and ``longer`` (:func:`~attnjax.experiment.config.longer_task`) when
    ``train.extrapolate > 1``."""

    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.task = tasks.get(task_name(config.task))
        self.tx = optimizer(config.optim, config.train.steps)
        self.graphdef = nnx.graphdef(nnx.eval_shape(lambda: self.build_model(jax.random.key(0))))
        options = QUICK if config.train.fast_compile else OPTIMIZED
        jit = functools.partial(jax.jit, compiler_options=options)
        self._init = jax.jit(jax.vmap(self._init_one), compiler_options=QUICK)  # runs once
        self._chunk = jit(jax.vmap(self._chunk_one, in_axes=(0, 0, 0, None)))
        self.splits = {split: (i, config.task) for split, i in EVAL_SPLITS.items()}
        if config.train.extrapolate > 1:
            self.splits["longer"] = (LONGER, longer_task(config))
        self._evals = {}  # one evaluation program per task config (length)
        for task_config in dict.fromkeys(t for _, t in self.splits.values()):
            one = functools.partial(self._eval_one, task_config=task_config)
            self._evals[task_config] = jit(_one_run_per_device_at_a_time(one))

    def build_model(self, key: Array) -> nnx.Module:
        """One run's model from its init ``key``. Subclasses may override it to change every
        run's model."""
        return nn.build(self.config.model, nnx.Rngs(key))

    def _init_one(self, seed: Array) -> TrainState:
        key = jax.random.fold_in(jax.random.key(seed), INIT)
        _, params, rest = nnx.split(self.build_model(key), nnx.Param, ...)
        return TrainState(params, rest, self.tx.init(params))

    def _forward(
        self, params: Any, rest: Any, batch: dict, dropout_key: Array | None = None
    ) -> tuple[Array, list[Array], list[Array]]:
        """Logits ``[B, T, C]``, and, when the loss or the diagnostics read them, each layer's
        attention weights ``[B, N, T, S]`` (hook point ``pattern``) and, for the diagnostics,
        its attention logits (``logits``, masked keys ``-inf``). Dropout is applied, with masks
        drawn from ``dropout_key``, iff a key is given (training); evaluation is
        deterministic."""
        model = nnx.merge(self.graphdef, params, rest)
        call = {}
        if self.config.model.dropout > 0:
            call = {"deterministic": dropout_key is None, "rngs": dropout_key}
        train = self.config.train
        if not (train.diagnostics or train.diversity != "none"):
            return model(batch, **call), [], []
        points = ("pattern", "logits") if train.diagnostics else ("pattern",)
        out, cache = nn.run_with_cache(
            model, batch, names=lambda name: name.rpartition(".")[2] in points, **call
        )
        return out, _per_layer(cache, "pattern"), _per_layer(cache, "logits")

    def _loss(self, params: Any, rest: Any, batch: dict, dropout_key: Array) -> Float[Array, ""]:
        train = self.config.train
        logits, weights, _ = self._forward(params, rest, batch, dropout_key)
        loss = self.task.loss(logits, batch)
        if train.z_loss:
            mask = batch["loss_mask"][..., None]
            loss = loss + analysis.z_loss(jnp.where(mask, logits, 0.0), train.z_loss)
        if train.diversity != "none":
            penalty = {
                "cosine": analysis.cosine_diversity_penalty,
                "orthogonality": analysis.orthogonality_penalty,
            }[train.diversity]
            loss = loss + train.diversity_weight * sum(penalty(w) for w in weights)
        return loss

    def _step_one(self, state: TrainState, learning_rate, seed: Array, step: Array):
        """Training step ``step`` of one run: the batch and the dropout masks are drawn from
        keys of (seed, step), so reruns and resumed runs are bit-exact. New state, loss."""
        params, rest, opt_state = state
        batch = self.task.generate(
            run_key(seed, DATA, step), self.config.train.batch_size, self.config.task
        )
        dropout_key = run_key(seed, DROPOUT, step)
        loss, grads = jax.value_and_grad(self._loss)(params, rest, batch, dropout_key)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: learning_rate * u, updates)
        return TrainState(optax.apply_updates(params, updates), rest, opt_state), loss

    def _chunk_one(self, state, learning_rate, seed, start_step):
        """``eval_every`` steps of one run; returns the new state and the mean training loss."""

        def step(state, i):
            return self._step_one(state, learning_rate, seed, start_step + i)

        state, losses = jax.lax.scan(step, state, jnp.arange(self.config.train.eval_every))
        return state, jnp.mean(losses)

    def eval_batch(self, seed: Array | int, split: str) -> dict[str, Array]:
        """The evaluation batch of ``split`` (a name of :attr:`splits`) for the runs of
        ``seed``: a draw of its own per seed and split, from keys disjoint from those of the
        training data, initialization and dropout; every input once when the task enumerates
        them. ``longer``'s batch is ``train.extrapolate`` times the training length."""
        split_id, task_config = self._split(split)
        return self._draw(seed, split_id, task_config)

    def _split(self, split: str) -> tuple[int, Any]:
        if split not in self.splits:
            raise ValueError(f"split: expected one of {list(self.splits)}, got {split!r}")
        return self.splits[split]

    def _draw(self, seed: Array | int, split_id: Array | int, task_config: Any) -> dict[str, Array]:
        if self.task.all_examples is not None:
            return self.task.all_examples(task_config)
        key = run_key(seed, EVAL, split_id)
        return self.task.generate(key, self.config.train.eval_batch_size, task_config)

    def _eval_one(
        self, params, rest, seed: Array, split_id: Array, task_config: Any
    ) -> dict[str, Array]:
        batch = self._draw(seed, split_id, task_config)
        outputs, weights, logits = self._forward(params, rest, batch)
        metrics = dict(self.task.metrics(outputs, batch))
        if self.config.train.diagnostics and weights:
            metrics |= _diagnostics(weights, logits)
        return metrics

    def init(self, runs: Runs) -> tuple[TrainState, Array]:
        """The initial states of ``runs`` and their learning rates, sharded over devices."""
        seeds = jnp.asarray(runs.seeds, jnp.uint32)
        state = self._init(seeds)
        lrs = jnp.asarray(runs.learning_rates, jnp.float32)
        return shard_runs((state, lrs))

    def train_chunk(self, state, runs: Runs, learning_rates, start_step: int):
        """``eval_every`` steps of every run from ``start_step``: new state, mean losses [R]."""
        seeds = shard_runs(jnp.asarray(runs.seeds, jnp.uint32))
        return self._chunk(state, learning_rates, seeds, jnp.int32(start_step))

    def evaluate(self, state: TrainState, runs: Runs, split: str) -> dict[str, np.ndarray]:
        """Metrics of every run on its seed's evaluation batch of ``split``, each ``[R]``."""
        seeds = shard_runs(jnp.asarray(runs.seeds, jnp.uint32))
        split_id, task_config = self._split(split)
        metrics = self._evals[task_config](state.params, state.rest, seeds, jnp.uint32(split_id))
        return {k: gather(v) for k, v in metrics.items()}

    def param_count(self) -> int:
        return param_count(lambda: self.build_model(jax.random.key(0)))

    def flops_per_step(self) -> float:
        """XLA's FLOP count (before optimization) of one run's training step: batch, loss,
        gradients and update."""
        state = jax.eval_shape(self._init_one, jnp.uint32(0))
        step = jax.jit(self._step_one).lower(state, 1.0, jnp.uint32(0), jnp.int32(0))
        return float(step.cost_analysis().get("flops", float("nan")))


@functools.lru_cache(maxsize=8)
def get_trainer(config: ExperimentConfig) -> Trainer:
    """A :class:`Trainer` shared by equal configs, so its compiled programs are reused."""
    return Trainer(config)


def _one_run_per_device_at_a_time(one: Callable) -> Callable:
    """``one(params, rest, seed, split_id)`` over runs ``[R]`` (``split_id`` shared): each device
    evaluates its runs one after another (``lax.map``), the devices in parallel (``vmap`` over
    the groups :func:`shard_runs` places). An evaluation batch is larger than a training batch
    and the dense additive score holds ``[B, T, S, A]`` per run: vectorized over 15 runs on
    compression-hard's longer split, it held 17.6 GB."""

    def evaluate(params, rest, seeds, split_id):
        groups = _device_groups(seeds.shape[0])
        runs = jax.tree.map(lambda x: x.reshape(groups, -1, *x.shape[1:]), (params, rest, seeds))
        metrics = jax.vmap(lambda xs: jax.lax.map(lambda x: one(*x, split_id), xs))(runs)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics)

    return evaluate


def gather(x: Array) -> np.ndarray:
    """``x`` as a numpy array on this process, gathered from every process's devices when
    the runs are sharded across processes (``jax.distributed``)."""
    if jax.process_count() > 1:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def _device_groups(runs: int) -> int:
    """Into how many device blocks :func:`shard_runs` splits ``runs`` runs: every device's
    when they divide evenly, else 1 (not sharded)."""
    devices = len(jax.devices())
    return devices if runs % devices == 0 else 1


def shard_runs(tree: Any) -> Any:
    """Place the leading run axis of every leaf across all devices when it divides evenly."""
    leaves = jax.tree.leaves(tree)
    if any(x.ndim == 0 or _device_groups(x.shape[0]) == 1 for x in leaves):
        return tree
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("runs",)), PartitionSpec("runs"))
    return jax.device_put(tree, sharding)


def collect(metrics: dict[str, np.ndarray], runs: Runs, **fields) -> list[dict[str, Any]]:
    """One row per run and metric: ``fields`` + seed, learning_rate, metric, value."""
    return [
        fields | {"seed": s, "learning_rate": lr, "metric": name, "value": float(values[r])}
        for name, values in metrics.items()
        for r, (s, lr) in enumerate(zip(runs.seeds, runs.learning_rates, strict=True))
    ]


def _per_layer(cache: nn.ActivationCache, point: str) -> list[Array]:
    """Each attention layer's hook point ``point`` in ``cache``, in the forward's order."""
    return [cache[name] for name in cache if name.rpartition(".")[2] == point]


def _diagnostics(weights: list[Array], logits: list[Array]) -> dict[str, Array]:
    """Attention diagnostics of every layer's weights and logits ``[B, N, T, S]`` (masked
    keys ``-inf``), averaged over layers (the max logit: maximum over layers). The effective
    rank is that of each example's head-averaged map ``[T, S]``."""

    def mean(per_layer):
        return jnp.mean(jnp.stack([per_layer(w) for w in weights]))

    return {
        "attention_entropy": mean(lambda w: analysis.entropy(w).mean()),
        "attention_saturation": mean(analysis.saturation),
        "attention_jacobian_norm": mean(lambda w: analysis.softmax_jacobian_norm(w).mean()),
        "attention_effective_rank": mean(lambda w: analysis.effective_rank(w.mean(axis=1)).mean()),
        "head_similarity": mean(analysis.cosine_diversity_penalty),
        "attention_max_logit": jnp.max(jnp.stack([jnp.max(z) for z in logits])),
    }
