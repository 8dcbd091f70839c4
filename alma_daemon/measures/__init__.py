"""The task's measures (``task.measure``), one module per kind of task; see :mod:`alma_daemon.measures.base`."""

from alma_daemon.measures.base import (
    DEFAULT_MEASURE,
    MEASURES,
    TASK_KINDS,
    Measure,
    Measurement,
    Target,
    build_measure,
    measure_class,
    stopping_measure,
)
from alma_daemon.measures.task import target_of, task_measure

__all__ = [
    "DEFAULT_MEASURE",
    "MEASURES",
    "TASK_KINDS",
    "Measure",
    "Measurement",
    "Target",
    "build_measure",
    "measure_class",
    "stopping_measure",
    "target_of",
    "task_measure",
]
