"""Shared fixtures: tiny deterministic datasets and real-server fixtures (tests/servers.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch

from alma_daemon.config import Config, LearnerConfig, build_config, learner_config
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData

pytest_plugins = ["tests.servers"]

#: A small colour-image task (CIFAR-like but 8x8) so VGG-based learners run fast in tests.
TINY_IMAGE_TASK = TaskInfo(
    "classification", (8, 8, 3), 4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), channels_last=True, augment=True
)


#: ``--set`` overrides for a small MNIST stream (4 chunks of 300, 2 epochs, width 8) that trains in seconds.
TINY_MNIST = [
    "stream.train_examples=1200",
    "stream.megabatches=4",
    "train.epochs=2",
    "learner.width=8",
    "dataset.test_examples=300",
    "device=cpu",
]


def config_for_any_learner(data: dict, overrides: Sequence[str] = ()) -> Config:
    """``build_config(data, overrides)`` where ``data["learner"]`` holds small sizes for every learner: the
    keys the chosen learner does not read are dropped, as :func:`learner_settings` does."""
    from alma_daemon.learners import learner_class

    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("learner.name=")]
    name = chosen[-1] if chosen else data.get("learner", {}).get("name", "sm")
    keys = {f.name for f in dataclasses.fields(learner_class(name).config_model)}
    learner = {k: v for k, v in data.get("learner", {}).items() if k in keys}
    return build_config({**data, "learner": learner}, list(overrides))


def learner_settings(name: str, shared: dict, overrides: dict | None = None) -> LearnerConfig:
    """Learner ``name``'s config from ``shared`` small sizes (``width``, ``members``, ...) without the keys it
    does not read, so that one set serves every learner, and ``overrides`` as given: a key the learner
    does not read there fails, as it would in a user's config."""
    from alma_daemon.learners import learner_class

    keys = {f.name for f in dataclasses.fields(learner_class(name).config_model)}
    return learner_config({**{k: v for k, v in shared.items() if k in keys}, **(overrides or {})}, name=name)


def separable_data(task: TaskInfo, n: int, seed: int = 0) -> LabeledData:
    """Examples whose class is written into the mean brightness of a region: learnable in a few epochs."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, task.num_classes, (n,), generator=g)
    x = torch.randint(0, 100, (n, *task.input_shape), generator=g).float()
    flat = x.view(n, -1)
    width = flat.shape[1] // task.num_classes
    for c in range(task.num_classes):
        rows = y == c
        flat[rows, c * width : (c + 1) * width] += 120
    return LabeledData(x.clamp(0, 255).to(torch.uint8), y)


@pytest.fixture
def mnist_like() -> tuple[TaskInfo, LabeledData, LabeledData]:
    return MNIST_TASK, separable_data(MNIST_TASK, 600, seed=1), separable_data(MNIST_TASK, 200, seed=2)
