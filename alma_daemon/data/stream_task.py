"""The task and the test set of a configured stream, read without its training data.

A consumer of the stream (the daemon) needs them before the first chunk arrives: the task to build
the learner and check incoming records, the test set to measure on. The test set is the one
``alma simulate`` measures on (the same files, the same ``dataset.test_examples`` subset), returned
undrifted: the engine drifts it from ``stream.drift.at`` on, whichever front door feeds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from alma_daemon.config import Config
from alma_daemon.data import arrays, declared_task
from alma_daemon.data.datasets import TaskInfo, load_test_set
from alma_daemon.data.river_streams import read_configured_river
from alma_daemon.data.table import read_table
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import text_task
from alma_daemon.seeding import generator


@dataclass(frozen=True)
class StreamTask:
    """What a stream's consumer knows before its first chunk: the task, and the test set (None: none)."""

    task: TaskInfo
    test: LabeledData | None


def load_stream_task(config: Config) -> StreamTask:
    """The task and the test set of the stream ``config.dataset`` describes."""
    stream = TASK_READERS.get(config.dataset.name, labeled_task)(config)
    return StreamTask(configured_task(stream.task, config), stream.test)


def select_test_examples(test: LabeledData, config: Config) -> LabeledData:
    """The test examples a labeled stream is measured on: all, or ``dataset.test_examples`` of them."""
    if config.dataset.test_examples is None:
        return test
    # A seeded random subset, not the first N: a test set may be sorted by class (the JPEG-decoded
    # CIFAR-10 copy is), and its first N examples would all be one class.
    order = torch.randperm(len(test), generator=generator(config.stream.seed, "test-subset"))
    return test.subset(order[: config.dataset.test_examples])


def labeled_task(config: Config) -> StreamTask:
    """A registered dataset of labeled examples (images): its test split only is read."""
    task, test = load_test_set(config.dataset.name, config.dataset.root)
    return StreamTask(task, select_test_examples(test, config))


def arrays_task(config: Config) -> StreamTask:
    """A user's arrays: the task as ``dataset.*`` and ``task.kind`` declare it, the test set from
    ``dataset.test_file`` if any."""
    task = declared_task.arrays_task(config.dataset, config.task)
    test = arrays.load_npz(config.dataset.test_file, task.regression) if config.dataset.test_file else None
    return StreamTask(task, test)


def corpus_task(config: Config) -> StreamTask:
    """A text corpus: the tokenizer's task and the encoded test text; the training text is not encoded."""
    task, test = text_task(config.dataset, config.stream)
    return StreamTask(task, test)


def river_task(config: Config) -> StreamTask:
    """A River stream (docs/river.md): its task, and the test set its simulation measures on (the
    stream is generated whole: the test set is its continuation)."""
    river = read_configured_river(config.dataset, config.stream.seed)
    return StreamTask(river.task, select_test_examples(river.test, config))


def table_task(config: Config) -> StreamTask:
    """A team's table (docs/results.md#backtesting-on-your-own-history): read whole, as ``alma simulate``
    reads it, since its test set is the ordered history's last share; that share is the test set."""
    table = read_table(config)
    return StreamTask(table.task, select_test_examples(table.test, config))


#: Datasets whose task is not a registered labeled dataset's, by name.
TASK_READERS: dict[str, Callable[[Config], StreamTask]] = {
    "arrays": arrays_task,
    "ptb": corpus_task,
    "text": corpus_task,
    "river": river_task,
    "table": table_task,
}
