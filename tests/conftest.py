"""Shared fixtures: tiny deterministic datasets and real-server fixtures (tests/servers.py)."""

from __future__ import annotations

import dataclasses

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


def learner_settings(name: str, values: dict) -> LearnerConfig:
    """Learner ``name``'s config from ``values`` without the keys it does not read, so that one set of small
    sizes (``width``, ``members``, ...) serves every learner."""
    from alma_daemon.learners import learner_class

    keys = {f.name for f in dataclasses.fields(learner_class(name).config_model)}
    return learner_config({k: v for k, v in values.items() if k in keys}, name=name)


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


@pytest.fixture
def small_config() -> Config:
    """A config that trains for a few epochs only."""
    return build_config(
        {"train": {"epochs": 3, "patience": 1, "batch_size": 64}, "learner": {"width": 8, "members": 2}}
    )
