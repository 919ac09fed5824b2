"""Toy tasks: jittable batch generators with their loss and metrics, found by name.

``tasks.get(name)`` returns a :class:`Task`; ``tasks.names()`` lists them. A new task is one
module defining ``TASK`` plus one line in ``_TASKS``.
"""

from attnjax.tasks import (
    automaton,
    compression,
    copying,
    fuzzy_recall,
    head_ordering,
    impostor,
    markov,
    memorization,
    min_of_keys,
    mqar,
    recall,
    selective_copying,
    xor_bits,
    xor_relation,
)
from attnjax.tasks.base import Batch, Task, TaskSpec

_TASKS = {
    task.name: task
    for task in (
        xor_relation.TASK,
        xor_bits.TASK,
        min_of_keys.TASK,
        copying.TASK,
        impostor.TASK,
        head_ordering.TASK,
        mqar.TASK,
        markov.TASK,
        recall.TASK,
        recall.NOISY_TASK,
        fuzzy_recall.TASK,
        selective_copying.TASK,
        compression.TASK,
        memorization.TASK,
        automaton.TASK,
    )
}


def get(name: str) -> Task:
    """The task registered as ``name``; ``ValueError`` listing the known names otherwise."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    return _TASKS[name]


def names() -> tuple[str, ...]:
    """The registered task names, sorted."""
    return tuple(sorted(_TASKS))


__all__ = ["Batch", "Task", "TaskSpec", "get", "names"]
