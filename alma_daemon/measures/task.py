"""The measure a task is judged by: ``task.measure`` on the task's own terms (classes, positive class, costs)."""

from __future__ import annotations

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.measures.base import Measure, Target, build_measure


def target_of(task: TaskInfo) -> Target:
    return Target(
        kind=task.target_kind,
        num_classes=task.num_classes,
        classes=task.classes,
        positive=task.positive,
        false_negative_cost=task.false_negative_cost,
        false_positive_cost=task.false_positive_cost,
        threshold=task.threshold,
    )


def task_measure(task: TaskInfo) -> Measure:
    """The measure of ``task`` (``task.measure``, else its kind's default); ValueError where it does not fit."""
    return build_measure(task.measure or None, target_of(task))
