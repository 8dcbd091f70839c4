"""A team's own tabular model, as ``learner.model: examples.custom.tabular:build`` names it.

A small MLP on numeric features: alma-daemon standardizes them first (``dataset.normalization``,
per-feature statistics of the stream's first chunk), so the network sees centred, unit-scale inputs.
"""

from __future__ import annotations

import math

from torch import nn

from alma_daemon.data.datasets import TaskInfo

#: Hidden units of each of the two hidden layers.
HIDDEN = 64


def build(task: TaskInfo) -> nn.Module:
    """An MLP from ``task.input_shape`` features to ``task.num_classes`` logits."""
    features = math.prod(task.input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, task.num_classes),
    )
