"""Networks as a team would write them, outside the package, for ``learner.model`` tests."""

from __future__ import annotations

import math

import torch
from torch import nn

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData


def tabular_mlp(task: TaskInfo) -> nn.Module:
    """An MLP whose hidden layers are grouped with their activations (what gMoE can make mixtures of)."""
    inputs = math.prod(task.input_shape)
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(inputs, 16), nn.ReLU()),
        nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
        nn.Linear(16, task.num_classes),
    )


class TinyConvNet(nn.Module):
    """A residual conv block and a linear head: not an nn.Sequential, so one layer to the learners."""

    def __init__(self, task: TaskInfo):
        super().__init__()
        channels = task.input_shape[-1] if task.channels_last else task.input_shape[0]
        self.stem = nn.Conv2d(channels, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, task.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.stem(x)
        z = z + self.block(z)
        return self.head(z.mean((2, 3)))


def wrong_classes(task: TaskInfo) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(task.input_shape), task.num_classes + 1))


def not_a_module(task: TaskInfo) -> object:
    return "a string"


def flat_first_layer(task: TaskInfo) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(task.input_shape), 8), nn.ReLU(), nn.Linear(8, task.num_classes)
    )


FEATURES = TaskInfo("classification", (6,), 3, normalization="standardize")


def feature_data(n: int, seed: int, shift: float = 0.0) -> LabeledData:
    """Standardizable features far from [0, 255] and of mixed sign, whose class is a linear function of them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g) * torch.tensor([1.0, 50.0, 0.01, 3.0, 1.0, 1000.0]) + torch.tensor(
        [0.0, -300.0, 0.5, 2.0, -1.0, 5e4]
    )
    score = x[:, 0] + x[:, 1] / 50.0 + shift
    y = (score > 0.5).long() + (score > -0.5).long()
    return LabeledData(x.float(), y)
