"""A config's terms applied to its stream's task (:func:`configured_task`): the normalization, the
statistics, the measure, classes, positive class, costs, decision and loss weights, each refused in one
line naming its key where it does not fit the task.

Without torch: start-up applies them to the task its data defines, ``alma config check`` to the task the
config and the dataset declare before any data is read (:mod:`alma_daemon.data.declared_task`), so the
two refuse a config in the same words.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from alma_daemon.config import Config, ConfigError, TaskConfig
from alma_daemon.data.task_info import TaskInfo


def configured_task(task: TaskInfo, config: Config) -> TaskInfo:
    """``task`` as ``dataset.normalization`` and the ``task`` section shape it: its normalization and
    statistics, its measure, class names, positive class, costs and loss weights. A term that does not
    fit the task is refused, naming its key. The names of an event's fields (``stream.features``) go
    in ``extra["features"]``, so serving takes the JSON the wire takes (serving/protocols/codecs.py)."""
    task = with_target_terms(normalized_task(task, config), config.task)
    if config.stream.features:
        task = replace(task, extra={**task.extra, "features": list(config.stream.features)})
    return task


def normalized_task(task: TaskInfo, config: Config) -> TaskInfo:
    """``task`` normalized as ``dataset.normalization`` asks (unset: as the dataset defines it), with
    the statistics ``task.feature_mean``/``feature_std`` or ``task.statistics_file`` give."""
    chosen = config.dataset.normalization
    if chosen is not None and chosen != task.normalization:
        if task.kind == "language_model":
            raise ConfigError(
                f"dataset.normalization: {config.dataset.name} streams tokens, which are not normalized; unset it"
            )
        task = replace(task, normalization=chosen, mean=(), std=(), power=())
    mean, std, key = given_statistics(config.task)
    if not mean:
        standardizing = task.normalization == "standardize"
        return replace(task, skewed_features=config.dataset.skewed_features) if standardizing else task
    if task.normalization != "standardize":
        raise ConfigError(
            f"task.{key}: the model standardizes no features (dataset.normalization is {task.normalization}); "
            "set dataset.normalization: standardize"
        )
    features = math.prod(task.input_shape)
    if len(mean) != features or len(std) != features:
        raise ConfigError(
            f"task.{key}: {len(mean)} means and {len(std)} standard deviations for {features} features "
            f"(input_shape {list(task.input_shape)})"
        )
    return replace(task, mean=tuple(mean), std=tuple(std))


def given_statistics(terms: TaskConfig) -> tuple[list[float], list[float], str]:
    """(means, standard deviations, the key that gave them) from config or its statistics file; empty
    lists where neither gives them (the first chunk's are taken)."""
    if terms.feature_mean:
        return list(terms.feature_mean), list(terms.feature_std), "feature_mean"
    if terms.statistics_file is None:
        return [], [], ""
    path = Path(terms.statistics_file).expanduser()
    try:
        data = json.loads(path.read_text())
        mean, std = [float(v) for v in data["mean"]], [float(v) for v in data["std"]]
    except FileNotFoundError:
        raise ConfigError(f"task.statistics_file: no file {str(path)!r}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f'task.statistics_file: {path} is not JSON {{"mean": [...], "std": [...]}} of numbers ({err!r})'
        ) from None
    if len(mean) != len(std) or any(not s > 0 for s in std) or not all(map(math.isfinite, mean + std)):
        raise ConfigError(f"task.statistics_file: {path} needs as many means as standard deviations, finite, std > 0")
    return mean, std, "statistics_file"


def with_target_terms(task: TaskInfo, terms: TaskConfig) -> TaskInfo:
    """``task`` with the ``task`` section's measure, class names, positive class, costs and loss weights."""
    if terms.kind is not None and task.kind == "language_model":
        raise ConfigError(f"task.kind: a language model predicts tokens, not a {terms.kind}; unset it")
    if terms.kind is not None and terms.kind != task.kind:
        raise ConfigError(
            f"task.kind: the dataset's task is a {task.kind} (its labels say so); it cannot be read as a {terms.kind}"
        )
    classifier = task.kind == "classification"
    for key in ("classes", "class_weights"):
        if getattr(terms, key) and not classifier:
            raise ConfigError(f"task.{key}: a {task.kind.replace('_', ' ')} task has no classes to name or weigh")
        if getattr(terms, key) and len(getattr(terms, key)) != task.num_classes:
            raise ConfigError(f"task.{key}: {len(getattr(terms, key))} given for the task's {task.num_classes} classes")
    classes = tuple(terms.classes) or task.classes
    positive = task.positive
    if terms.positive_class is not None:
        if not classifier or task.num_classes != 2:
            raise ConfigError(
                f"task.positive_class: only a binary task has a positive class (this one has {task.num_classes} classes)"
            )
        positive = class_index(terms.positive_class, classes, "task.positive_class")
    costs_set = (terms.false_negative_cost, terms.false_positive_cost) != (1.0, 1.0)
    if costs_set and terms.measure != "cost":
        raise ConfigError(
            "task.false_negative_cost: costs are read only by task.measure: cost; set it, or unset the costs"
        )
    decision = terms.decision
    if decision not in ("auto", "argmax") and (not classifier or task.num_classes != 2):
        raise ConfigError(
            f"task.decision: {decision} decides between two classes; this task has {task.num_classes} "
            "(use argmax or auto)"
        )
    if decision == "auto":
        decision = "cost" if terms.measure == "cost" and task.num_classes == 2 else "argmax"
    return replace(
        task,
        decision="" if decision == "argmax" else decision,
        decision_target=terms.decision_target,
        measure=terms.measure or task.measure,
        classes=classes,
        positive=positive,
        false_negative_cost=terms.false_negative_cost,
        false_positive_cost=terms.false_positive_cost,
        class_weights=tuple(terms.class_weights) or task.class_weights,
    )


def class_index(label: str, classes: tuple[str, ...], key: str) -> int:
    """The index of a class given by name (one of ``classes``) or by index."""
    if label in classes:
        return classes.index(label)
    if label.isdigit() and int(label) < max(2, len(classes)):
        return int(label)
    known = ", ".join(classes) if classes else "0, 1"
    raise ConfigError(f"{key}: {label!r} is not a class; the classes are {known}")


def drift_misfit(kind: str, task: TaskInfo) -> str | None:
    """Why ``stream.drift.kind`` cannot change a stream of ``task`` (None: it can), as start-up and
    ``alma config check`` refuse it."""
    if kind == "none":
        return None
    if task.kind != "classification":
        return f"stream.drift.kind: {kind} needs labeled examples; this stream is a {task.kind}"
    if kind == "rotate" and len(task.input_shape) not in (2, 3):
        return (
            "stream.drift.kind: rotate needs images (height x width [x channels]); inputs have shape "
            f"{list(task.input_shape)}"
        )
    return None


def features_misfit(config: Config, task: TaskInfo) -> str | None:
    """Why ``stream.features`` (the names of an event's fields) cannot name the inputs of ``task``."""
    features = config.stream.features
    if task.kind == "language_model" or not features or tuple(task.input_shape) == (len(features),):
        return None
    return (
        f"stream.features: {len(features)} names, but one example of {config.dataset.name} has shape "
        f"{tuple(task.input_shape)}; name one field per input value"
    )
