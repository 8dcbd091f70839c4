"""Checkpoints for the publishers' tests: a quick trainer, small learners, saved versions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from alma_daemon import metrics
from alma_daemon.config import TrainConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner, build_learner
from alma_daemon.training.loop import Trainer
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data

#: The publisher contract's checks by name (alma_daemon/testing), which every publisher's test runs.
CHECKS = [
    "first_version_is_promoted_unguarded_and_served",
    "a_worse_version_is_refused_and_never_served",
    "a_decided_version_is_skipped",
    "a_better_version_replaces_the_live_one",
    "rollback_serves_the_earlier_version",
    "versions_beyond_keep_versions_are_released",
    "a_version_not_on_disk_is_a_clear_error",
]


def quick_trainer(seed: int = 0) -> Trainer:
    return Trainer(TrainConfig(epochs=4, patience=4, batch_size=64), "adadelta", torch.device("cpu"), seed=seed)


def new_learner(name: str = "sm", task: TaskInfo = MNIST_TASK, seed: int = 0) -> Learner:
    return build_learner(name, task, learner_settings(name, {"width": 8, "members": 2}), seed)


def save_version(store: CheckpointStore, version: int, learner: Learner, sample: LabeledData) -> Path:
    """A checkpoint like the engine's: metrics.json with val_<measure>, and the validation sample."""
    measure = learner.measure
    return store.save(
        learner, version, {f"val_{measure}": learner.evaluate(sample)[measure], "kind": "finetune"}, validation=sample
    )


@pytest.fixture(scope="module")
def good_and_bad() -> tuple[Learner, Learner, LabeledData]:
    """A trained SM, an untrained one, and a validation sample on which the first is far better."""
    good, bad = new_learner(seed=0), new_learner(seed=1)
    good.fit(separable_data(MNIST_TASK, 600, seed=1), separable_data(MNIST_TASK, 100, seed=2), quick_trainer())
    sample = separable_data(MNIST_TASK, 200, seed=3)
    assert good.evaluate(sample)["error"] + 0.3 < bad.evaluate(sample)["error"], "fixture: good must beat bad"
    return good, bad, sample


def metric_value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def clients_during(ask: Callable[[int], str], work: Callable[[], None], clients: int = 4) -> list[list[str]]:
    """Run ``work`` while ``clients`` threads call ``ask(client)`` in a loop, each as fast as it is
    answered; each thread's answers, in order ("ok", or what went wrong; an exception is "no answer")."""
    stop = threading.Event()
    answers: list[list[str]] = [[] for _ in range(clients)]

    def client(index: int) -> None:
        while not stop.is_set():
            try:
                answers[index].append(ask(index))
            except Exception as err:
                answers[index].append(f"no answer: {err!r}")

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    try:
        work()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return answers
