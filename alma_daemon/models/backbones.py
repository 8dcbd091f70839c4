"""Backbones of the paper (appendix B): an MLP for MNIST and a reduced VGG19-BN for CIFAR-10.

Every backbone starts with :class:`Normalize`, so a model takes inputs in raw units (0-255 pixels,
channels-last images as stored on the wire) and serving needs no separate preprocessing.
"""

from __future__ import annotations

import torch
from torch import nn

from alma_daemon.data.datasets import TaskInfo

#: VGG19's layer plan: conv layers per block, a max-pool after each block (Wu et al. 2020 reduce
#: every conv to the same channel count).
VGG19_BLOCKS = (2, 2, 4, 4, 4)


class Normalize(nn.Module):
    """Raw inputs (0-255, channels-last images as on the wire) -> standardized floats (NCHW images)."""

    def __init__(self, task: TaskInfo):
        super().__init__()
        mean = torch.tensor(task.mean or (0.0,), dtype=torch.float32) * 255.0
        std = torch.tensor(task.std or (1.0,), dtype=torch.float32) * 255.0
        self.channels_last = task.channels_last
        self.per_channel = len(task.input_shape) == 3
        if self.per_channel:
            mean, std = mean.reshape(1, -1, 1, 1), std.reshape(1, -1, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return (x - self.mean) / self.std


def mlp_layers(task: TaskInfo, width: int) -> list[nn.Module]:
    """The MLP's trainable layers: two hidden ReLU layers of ``width`` units and a linear classifier."""
    inputs = 1
    for d in task.input_shape:
        inputs *= d
    return [
        nn.Sequential(nn.Flatten(), nn.Linear(inputs, width), nn.ReLU()),
        nn.Sequential(nn.Linear(width, width), nn.ReLU()),
        nn.Linear(width, task.num_classes),
    ]


def conv_bn_relu(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def vgg_layers(task: TaskInfo, width: int) -> list[nn.Module]:
    """Reduced VGG19-BN: 16 conv-BN-ReLU layers of ``width`` channels, 5 max-pools, a linear classifier.

    Each block (convs + pool) is one element, so MoE variants can replace the first blocks.
    """
    channels = task.input_shape[-1] if task.channels_last else task.input_shape[0]
    layers: list[nn.Module] = []
    for convs in VGG19_BLOCKS:
        block = []
        for _ in range(convs):
            block.append(conv_bn_relu(channels, width))
            channels = width
        block.append(nn.MaxPool2d(2))
        layers.append(nn.Sequential(*block))
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(width, task.num_classes)))
    return layers


class Backbone(nn.Module):
    """Normalization followed by a list of layers; maps raw inputs to logits."""

    def __init__(self, task: TaskInfo, layers: list[nn.Module]):
        super().__init__()
        self.normalize = Normalize(task)
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.normalize(x))


def build_backbone(task: TaskInfo, width: int) -> Backbone:
    """The paper's backbone for the task: MLP for flat/grayscale inputs, VGG for colour images."""
    if len(task.input_shape) == 3:
        return Backbone(task, vgg_layers(task, width))
    return Backbone(task, mlp_layers(task, width))
