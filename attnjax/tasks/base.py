"""What every toy task shares: the task record, its spec, config checks, loss and metrics.

A batch is a dict ``{"inputs": int[B, T] | float[B, T, F], "targets": int[B, T],
"loss_mask": bool[B, T]}``; targets at positions where ``loss_mask`` is False are 0 and carry
no meaning. A model maps a batch to logits ``[B, T, C]`` with ``C = spec.num_classes``.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

Batch = dict[str, Array]
Logits = Float[Array, "B T C"]


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What a model config needs to know about a task's batches.

    Exactly one of ``vocab_size`` (int inputs ``[B, T]``) and ``num_features`` (float inputs
    ``[B, T, F]``) is set. ``chance_accuracy`` is the accuracy at ``loss_mask`` positions of
    the best prediction that ignores the inputs. ``baselines`` holds task-specific reference
    values (e.g. exact losses) by name.
    """

    seq_len: int
    num_classes: int
    chance_accuracy: float
    vocab_size: int | None = None
    num_features: int | None = None
    baselines: Mapping[str, float] = dataclasses.field(default_factory=dict)


def masked_mean(x: Float[Array, "B T"], mask: Array) -> Float[Array, ""]:
    """Mean of ``x`` over positions where ``mask`` is set (0 when none is)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy(logits: Logits, batch: Batch) -> Float[Array, ""]:
    """Mean cross-entropy (nats) of ``targets`` at ``loss_mask`` positions; float32."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
    return masked_mean(nll, batch["loss_mask"])


def classification_metrics(logits: Logits, batch: Batch) -> dict[str, Float[Array, ""]]:
    """``loss`` and ``accuracy`` (argmax == target) at ``loss_mask`` positions."""
    correct = jnp.argmax(logits, axis=-1) == batch["targets"]
    return {
        "loss": cross_entropy(logits, batch),
        "accuracy": masked_mean(correct.astype(jnp.float32), batch["loss_mask"]),
    }


def sequence_metrics(logits: Logits, batch: Batch) -> dict[str, Float[Array, ""]]:
    """:func:`classification_metrics` plus ``sequence_accuracy``: the fraction of examples
    whose every ``loss_mask`` position is right."""
    correct = (jnp.argmax(logits, axis=-1) == batch["targets"]) | ~batch["loss_mask"].astype(bool)
    return {
        **classification_metrics(logits, batch),
        "sequence_accuracy": jnp.mean(jnp.all(correct, axis=-1).astype(jnp.float32)),
    }


@dataclasses.dataclass(frozen=True)
class Task:
    """A registered task: ``generate(key, batch_size, config) -> batch`` (pure; jit it with
    ``static_argnums=(1, 2)``), its config class (whose ``spec`` property is a
    :class:`TaskSpec`), and the loss and metrics of its logits. A task with few equally likely
    inputs may give ``all_examples(config) -> batch`` (each input once): it is then evaluated
    on exactly those, so its metrics are population values with no sampling noise.

    ``next_token`` declares next-token prediction: the targets are the next inputs
    (``targets[:, t] == inputs[:, t + 1]`` wherever ``loss_mask`` is set) over the inputs'
    vocabulary (``num_classes == vocab_size``), so a model's predictions can be fed back as
    its inputs (:func:`attnjax.nn.generate`). Every other task leaves it False."""

    name: str
    config: type
    generate: Callable[[PRNGKeyArray, int, Any], Batch]
    loss: Callable[[Logits, Batch], Float[Array, ""]] = cross_entropy
    metrics: Callable[[Logits, Batch], dict[str, Float[Array, ""]]] = classification_metrics
    all_examples: Callable[[Any], Batch] | None = None
    next_token: bool = False


def split_examples(
    example: Callable[[PRNGKeyArray], tuple[Array, ...]], key: PRNGKeyArray, batch_size: int
) -> tuple[Array, ...]:
    """``vmap`` a one-example generator over ``batch_size`` keys split from ``key``."""
    return jax.vmap(example)(jax.random.split(key, batch_size))


def one_target(inputs: Array, target: Array) -> Batch:
    """A batch whose only target, ``target [B]``, sits at the last position of ``inputs``."""
    batch_size, seq_len = inputs.shape[:2]
    last = jnp.arange(seq_len) == seq_len - 1
    return {
        "inputs": inputs,
        "targets": jnp.where(last, target[:, None], 0).astype(jnp.int32),
        "loss_mask": jnp.broadcast_to(last, (batch_size, seq_len)),
    }


def longer(config: Any, factor: int) -> Any:
    """The length-extrapolation split of a task whose config has a ``seq_len`` field: the same
    config at ``factor`` times the sequence length (every other knob unchanged, the result
    validated by the config). Train on ``config``, evaluate on ``longer(config, 2)`` separately;
    the trainer's own splits (``valid``, ``test``) stay at the training length."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor must be an int >= 1, got {factor!r}")
    if not hasattr(config, "seq_len"):
        raise ValueError(f"{type(config).__name__} has no seq_len field to lengthen")
    return dataclasses.replace(config, seq_len=config.seq_len * factor)


def _fail(config: Any, name: str, expected: str) -> None:
    value = getattr(config, name)
    raise ValueError(f"{type(config).__name__}.{name} must be {expected}, got {value!r}")


def check_int(config: Any, name: str, low: int, high: int | float = math.inf) -> None:
    """Raise ``ValueError`` unless ``config.<name>`` is an int in ``[low, high]``."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        _fail(config, name, "an int")
    if not low <= value <= high:
        _fail(config, name, f"an int >= {low}" if high == math.inf else f"in [{low}, {high}]")


def check_float(
    config: Any, name: str, low: float, high: float = math.inf, open_low: bool = False
) -> None:
    """Raise ``ValueError`` unless ``config.<name>`` is a finite real in ``[low, high]``
    (``(low, high]`` with ``open_low``)."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        _fail(config, name, "a number")
    too_low = value <= low if open_low else value < low
    if not math.isfinite(value) or too_low or value > high:
        bracket = "(" if open_low else "["
        _fail(config, name, f"a finite number in {bracket}{low}, {high}]")


def check_choice(config: Any, name: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``config.<name>`` is one of ``choices``."""
    if getattr(config, name) not in choices:
        _fail(config, name, f"one of {choices}")


def check_noise(config: Any) -> None:
    """The noise fields: ``noise_vocab_size`` ≥ 0 and ``frac_noise`` in [0, 1), 0 when there
    are no noise tokens."""
    check_int(config, "noise_vocab_size", 0)
    check_float(config, "frac_noise", 0.0, 1.0)
    check_that(config, "frac_noise", config.frac_noise < 1, "below 1")
    check_that(
        config,
        "frac_noise",
        config.frac_noise == 0 or config.noise_vocab_size > 0,
        "0 when noise_vocab_size is 0",
    )


def check_that(config: Any, name: str, ok: bool, expected: str) -> None:
    """Raise ``ValueError`` naming ``config.<name>`` unless ``ok``."""
    if not ok:
        _fail(config, name, expected)
