"""Typed, frozen experiment configs, validated on construction, with dotted overrides.

An :class:`ExperimentConfig` holds a task config (one of ``attnjax.tasks``' config classes), a
:class:`~attnjax.nn.ModelConfig`, an :class:`OptimConfig` and a :class:`TrainConfig`. The model's
input and output fields (``embedding``, ``vocab_size``, ``in_features``, ``num_classes``) are
derived from the task's spec, so a config never states them twice.
"""

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, get_type_hints

from attnjax import tasks
from attnjax.nn import ModelConfig
from attnjax.nn.config import check_type
from attnjax.tasks.base import longer


def check_types(instance: Any) -> None:
    """``TypeError`` naming the field unless each field matches its annotation."""
    for name, tp in get_type_hints(type(instance)).items():
        if tp is not Any:
            check_type(f"{type(instance).__name__}.{name}", getattr(instance, name), tp)


def _require(ok: bool, owner: Any, name: str, expected: str) -> None:
    if not ok:
        value = getattr(owner, name)
        raise ValueError(f"{type(owner).__name__}.{name}: expected {expected}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW (or plain SGD: ``optimizer="sgd"``, which ignores ``b1``, ``b2``) with linear
    warm-up, then a constant or cosine-decayed learning rate."""

    optimizer: str = "adamw"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    decay_all: bool = False  # weight decay on norms, biases and vectors too (else rank >= 2)
    b1: float = 0.9
    b2: float = 0.999
    warmup_steps: int = 0
    schedule: str = "constant"
    clip_norm: float | None = None

    def __post_init__(self):
        check_types(self)
        _require(self.optimizer in ("adamw", "sgd"), self, "optimizer", "adamw | sgd")
        _require(self.learning_rate > 0, self, "learning_rate", "> 0")
        _require(self.weight_decay >= 0, self, "weight_decay", ">= 0")
        _require(0 <= self.b1 < 1 and 0 <= self.b2 < 1, self, "b1", "b1, b2 in [0, 1)")
        _require(self.warmup_steps >= 0, self, "warmup_steps", ">= 0")
        _require(self.schedule in ("constant", "cosine"), self, "schedule", "constant | cosine")
        _require(self.clip_norm is None or self.clip_norm > 0, self, "clip_norm", "None or > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Steps, batch sizes and evaluation cadence. Evaluation runs every ``eval_every`` steps on
    ``eval_batch_size`` fresh examples (the same for every run); steps between evaluations are
    fused into one ``lax.scan``. ``z_loss`` weights Wortsman et al.'s output z-loss;
    ``diversity`` adds a head-diversity penalty (``cosine`` | ``orthogonality``) weighted by
    ``diversity_weight``; ``diagnostics`` records attention entropy, saturation, softmax
    Jacobian norm, effective rank, head similarity and the largest attention logit
    (``attention_max_logit``, over layers). ``patching`` also writes run 0's activation
    patching heatmaps (``patching.png``, ``patching.npz``: each head's output and each
    position's residual stream patched from one task batch into another) into the run folder.
    ``fast_compile`` compiles the training and evaluation programs with XLA's backend
    optimization level 0 instead of 1: on CPU about 1.7× faster to compile and 2-4× slower to
    run, the right trade for runs of a few chunks (smoke tests). ``tensorboard`` also logs
    every metric for TensorBoard under ``<run>/tensorboard/`` (needs tensorboardX).
    ``extrapolate`` > 1 adds a third evaluation split, ``longer``: ``eval_batch_size`` fresh
    examples of the task at ``extrapolate`` times the training length
    (:func:`attnjax.tasks.base.longer`), reported beside ``valid`` and ``test`` and never used
    for training or for choosing a learning rate; 1 evaluates at the training length only."""

    steps: int = 1000
    batch_size: int = 64
    eval_every: int = 100
    eval_batch_size: int = 512
    seed: int = 0
    z_loss: float = 0.0
    diversity: str = "none"
    diversity_weight: float = 0.0
    diagnostics: bool = False
    patching: bool = False
    fast_compile: bool = True
    tensorboard: bool = False
    extrapolate: int = 1

    def __post_init__(self):
        check_types(self)
        for name in ("steps", "batch_size", "eval_every", "eval_batch_size", "extrapolate"):
            _require(getattr(self, name) >= 1, self, name, ">= 1")
        _require(self.steps % self.eval_every == 0, self, "steps", "a multiple of eval_every")
        _require(self.z_loss >= 0, self, "z_loss", ">= 0")
        choices = ("none", "cosine", "orthogonality")
        _require(self.diversity in choices, self, "diversity", " | ".join(choices))
        _require(self.diversity_weight >= 0, self, "diversity_weight", ">= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One training run: task, model, optimizer, training. ``name`` names the run folder.

    ``model`` may be given as a plain dict of :class:`~attnjax.nn.ModelConfig` fields without
    the fields derived from the task; it is stored as a complete ``ModelConfig``.
    """

    name: str
    task: Any
    model: ModelConfig | Mapping
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()

    def __post_init__(self):
        check_types(self)
        name = task_name(self.task)  # raises for an unregistered config class
        spec = self.task.spec
        derived = {
            "task": name,
            "next_token": tasks.get(name).next_token,
            "embedding": "tokens" if spec.vocab_size is not None else "linear",
            "vocab_size": spec.vocab_size,
            "in_features": spec.num_features,
            "num_classes": spec.num_classes,
        }
        if isinstance(self.model, ModelConfig):
            model = dataclasses.replace(self.model, **derived)
        else:
            model = ModelConfig.from_dict({**self.model, **derived})
        object.__setattr__(self, "model", model)
        longer_task(self)  # raises when the longer split cannot be drawn or read

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :func:`from_dict` inverts it."""
        out = {s: dataclasses.asdict(getattr(self, s)) for s in ("model", "optim", "train")}
        return {
            "name": self.name,
            "task": {"name": task_name(self.task)} | _fields(self.task),
        } | out


def longer_task(config: ExperimentConfig) -> Any | None:
    """The task config of ``config``'s ``longer`` split (``train.extrapolate`` times the
    training length), None when ``train.extrapolate`` is 1. ``ValueError`` naming
    ``TrainConfig.extrapolate`` when the task has no such split (no ``seq_len``, or evaluated on
    all its examples) or the model cannot read it (a learned positional table too short)."""
    factor, name = config.train.extrapolate, task_name(config.task)
    if factor == 1:
        return None
    where = f"TrainConfig.extrapolate={factor}: task {name!r}"
    if tasks.get(name).all_examples is not None:
        raise ValueError(f"{where} is evaluated on all its examples at the training length")
    try:
        task = longer(config.task, factor)
    except ValueError as error:
        raise ValueError(f"{where} has no longer split: {error}") from None
    model = config.model
    learned = model.kind == "transformer" and model.positional == "learned"
    if learned and model.max_len < task.seq_len:
        raise ValueError(
            f"{where} at seq_len {task.seq_len} exceeds the learned positional table "
            f"(model.max_len={model.max_len}); raise model.max_len or use another positional"
        )
    return task


def _fields(instance: Any) -> dict[str, Any]:
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


def task_name(task_config: Any) -> str:
    """The registered name of the task whose config class ``task_config`` is an instance of."""
    for name in tasks.names():
        if isinstance(task_config, tasks.get(name).config):
            return name
    raise TypeError(f"task: expected a config of a registered task, got {task_config!r}")


def from_dict(values: Mapping[str, Any]) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from :meth:`ExperimentConfig.to_dict`'s output (JSON lists
    become tuples)."""
    values = _tuples(values)
    task = dict(values["task"])
    task_config = tasks.get(task.pop("name")).config(**task)
    return ExperimentConfig(
        name=values["name"],
        task=task_config,
        model=values["model"],
        optim=OptimConfig(**values["optim"]),
        train=TrainConfig(**values["train"]),
    )


def _tuples(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _tuples(v) for k, v in x.items()}
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    return x


_NONE = ("none", "null")
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def parse_typed(text: str, tp: Any) -> Any:
    """A ``--set`` value parsed by its field's declared type ``tp``: ``true``/``false``,
    ``none``/``null``, ``1_000``, ``3e-4``, tuples as ``(1, 2)`` or ``1,2``; strings as
    given. Never evaluated as code. ``ValueError`` names what was expected."""
    text = text.strip()
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in _NONE:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return parse_typed(text, option)
            except ValueError:
                continue
        raise ValueError(f"expected {_type_name(tp)}, got {text!r}")
    if tp is bool:
        if text.lower() not in _BOOLS:
            raise ValueError(f"expected true or false, got {text!r}")
        return _BOOLS[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ValueError(f"expected {tp.__name__}, got {text!r}") from None
    if tp is str:
        return text
    if tp is tuple or origin is tuple:
        items = [x for x in text.strip("()[] ").split(",") if x.strip()]
        kinds = args[:1] * len(items) if len(args) == 2 and args[1] is Ellipsis else args
        kinds = kinds or (str,) * len(items)  # a bare ``tuple``: strings
        if len(kinds) != len(items):
            raise ValueError(f"expected {len(kinds)} items, got {text!r}")
        return tuple(parse_typed(x, k) for x, k in zip(items, kinds, strict=True))
    raise ValueError(f"cannot parse a value of type {_type_name(tp)} from --set")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def parse_overrides(config: ExperimentConfig, pairs: Sequence[str]) -> dict[str, Any]:
    """``["section.field=value", ...]`` as overrides for :func:`with_overrides`, each value
    parsed by the field's declared type (:func:`parse_typed`); errors name the field."""
    out = {}
    for pair in pairs:
        path, sep, text = pair.partition("=")
        path = path.strip()
        if not sep:
            raise ValueError(f"--set {pair!r}: expected section.field=value")
        tp = _field_type(config, path)
        try:
            out[path] = parse_typed(text, tp)
        except ValueError as error:
            raise ValueError(f"--set {path}: {error}") from None
    return out


def _field_type(config: ExperimentConfig, path: str) -> Any:
    """The declared type of ``path`` (``name`` or ``section.field``)."""
    section, _, field = path.partition(".")
    if not field:
        return str if section == "name" else _unknown(path, "expected 'section.field' or 'name'")
    if section not in ("task", "model", "optim", "train"):
        return _unknown(path, f"unknown section {section!r}; expected task, model, optim or train")
    hints = typing.get_type_hints(type(getattr(config, section)))
    if field not in hints:
        return _unknown(
            path, f"unknown field {field!r} of {section}; expected one of {sorted(hints)}"
        )
    return hints[field]


def _unknown(path: str, why: str):
    raise ValueError(f"override {path!r}: {why}")


def with_overrides(config: ExperimentConfig, overrides: Mapping[str, Any]) -> ExperimentConfig:
    """``config`` with dotted fields replaced, e.g. ``{"model.score": "additive"}``.

    Unknown sections or fields raise ``ValueError``; values are checked by the sections' own
    validation, so a value of the wrong type raises there.
    """
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for path, value in overrides.items():
        _field_type(config, path)  # the path must name a field
        section, _, field = path.partition(".")
        if field:
            sections.setdefault(section, {})[field] = value
        else:
            top[section] = value
    replaced = {s: dataclasses.replace(getattr(config, s), **f) for s, f in sections.items()}
    return dataclasses.replace(config, **replaced, **top)
