"""Whether a reference learner (``reference.kind``) fits a task, without River or torch: start-up and
``alma config check`` refuse a linear reference that cannot learn the task in the same words."""

from __future__ import annotations

import importlib.util

from alma_daemon.config import ConfigError
from alma_daemon.data.task_info import TaskInfo

#: ``reference.kind: auto`` learns a linear reference on at most this many features: River's dicts
#: cost about a microsecond per feature and example, and wider inputs are pixels more often than not.
AUTO_MAX_FEATURES = 256


def river_installed() -> bool:
    return importlib.util.find_spec("river") is not None


def unfit_reason(task: TaskInfo) -> str | None:
    """Why a linear reference cannot learn ``task`` (None: it can): its examples are not flat numbers."""
    if task.kind == "language_model":
        return "has no model for a language model's tokens (a unigram model could be one, later)"
    if len(task.input_shape) != 1:
        shape = "x".join(str(d) for d in task.input_shape)
        return f"needs flat numeric features (one axis); this task's examples are {shape} (images or arrays)"
    return None


def resolved_kind(kind: str, task: TaskInfo) -> str:
    """``reference.kind`` for ``task``: ``linear`` or ``none``; ``auto`` is linear where it fits (flat
    features, at most :data:`AUTO_MAX_FEATURES` of them) and River is installed. ``linear`` where it
    cannot learn is refused in one line naming ``reference.kind``."""
    if kind == "none":
        return "none"
    if kind == "linear":
        check_linear(task)
        return "linear"
    if unfit_reason(task) is not None or task.input_shape[0] > AUTO_MAX_FEATURES or not river_installed():
        return "none"
    return "linear"


def check_linear(task: TaskInfo) -> None:
    """Refuse ``reference.kind: linear`` without River, or on a ``task`` it cannot learn."""
    require_river()
    why = unfit_reason(task)
    if why is not None:
        raise ConfigError(f"reference.kind: linear {why}; set reference.kind: auto or none")


def require_river() -> None:
    """Refuse ``reference.kind: linear`` where River is not installed."""
    if not river_installed():
        raise ConfigError(
            "reference.kind: linear needs River: pip install 'alma-daemon[river]' (or set reference.kind: auto or none)"
        )
