"""The task a config declares before any data is read (:func:`declared_task`), without torch.

Start-up checks the config's terms against the task its data defines; ``alma config check`` checks them
against this one, with the same functions (:func:`alma_daemon.core.task_fit.check_config_against_task`),
so both refuse a config in the same words. A registered image dataset declares its task whole; a team's
arrays by ``dataset.input_shape`` and ``num_classes``; a table by ``task`` (its kind, its classes) as far
as the config names them, the rest taken to agree; a corpus is a language model. A River stream's task
is known once River builds it: none is declared.
"""

from __future__ import annotations

from collections.abc import Callable

from alma_daemon.config import Config, ConfigError, DatasetConfig, TaskConfig
from alma_daemon.config.measure_traits import measure_traits
from alma_daemon.data.task_info import CIFAR10_TASK, MNIST_TASK, TaskInfo

#: The measures that judge a regression: with ``task.kind`` unset, one of them makes a team's target a number.
REGRESSION_MEASURES = tuple(name for name, traits in measure_traits().items() if "regression" in traits.kinds)


def declared_kind(terms: TaskConfig) -> str:
    """The kind of task a team's arrays or table hold: ``task.kind``, else a regression where
    ``task.measure`` judges one, else classification."""
    if terms.kind is not None:
        return terms.kind
    return "regression" if terms.measure in REGRESSION_MEASURES else "classification"


def arrays_task(config: DatasetConfig, terms: TaskConfig | None = None) -> TaskInfo:
    """The task declared by ``dataset.input_shape`` and ``dataset.num_classes``, or by ``dataset.input_shape``
    alone for a regression (:func:`declared_kind` of ``terms``, the ``task`` section; None: a classifier)."""
    regression = terms is not None and declared_kind(terms) == "regression"
    if regression:
        if not config.input_shape:
            raise ConfigError("dataset.name=arrays needs dataset.input_shape (e.g. [30]) for a regression's features")
        if config.num_classes is not None:
            raise ConfigError("dataset.num_classes: a regression (task.kind, task.measure) has no classes; unset it")
        return TaskInfo("regression", tuple(config.input_shape), 1)
    if not config.input_shape or config.num_classes is None:
        raise ConfigError("dataset.name=arrays needs dataset.input_shape (e.g. [28, 28]) and dataset.num_classes")
    return TaskInfo("classification", tuple(config.input_shape), config.num_classes)


def declared_task(config: Config) -> TaskInfo | None:
    """The task ``config`` declares for its dataset before any of it is read; None where only the data can tell."""
    declare = DECLARED_TASKS.get(config.dataset.name)
    return declare(config) if declare is not None else None


def table_task(config: Config) -> TaskInfo:
    """A table's task as ``task`` and ``dataset`` name it; what they leave open (the feature count, the
    classes) is taken to agree with what they do name."""
    terms, dataset = config.task, config.dataset
    features = len(dataset.feature_columns or config.stream.features or terms.feature_mean) or 1
    if declared_kind(terms) == "regression":
        return TaskInfo("regression", (features,), 1, normalization="standardize")
    classes = len(terms.classes) or dataset.num_classes or len(terms.class_weights) or 2
    return TaskInfo("classification", (features,), classes, normalization="standardize")


def language_model_task(config: Config) -> TaskInfo:
    """A corpus: a language model over its tokenizer's vocabulary (``dataset.vocab_size`` when trained)."""
    return TaskInfo("language_model", (config.stream.seq_len,), config.dataset.vocab_size, normalization="none")


#: The declared task of each dataset that declares one, by ``dataset.name``.
DECLARED_TASKS: dict[str, Callable[[Config], TaskInfo]] = {
    "mnist": lambda config: MNIST_TASK,
    "cifar10": lambda config: CIFAR10_TASK,
    "ptb": language_model_task,
    "text": language_model_task,
    "arrays": lambda config: arrays_task(config.dataset, config.task),
    "table": table_task,
}
