"""A team's own small ResNet for 32x32 colour images, as ``learner.model: examples.custom.resnet:build``.

alma-daemon hands the network images as the task's normalization leaves them: NCHW float32,
standardized with CIFAR-10's channel statistics (``dataset.normalization: pixels``).
"""

from __future__ import annotations

import torch
from torch import nn

from alma_daemon.data.datasets import TaskInfo

#: Channels of the three stages; each stage halves the resolution after the first.
CHANNELS = (8, 16, 32)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a skip connection (a 1x1 projection when the shape changes)."""

    def __init__(self, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False),
            nn.BatchNorm2d(channels_out),
        )
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.skip = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class SmallResNet(nn.Module):
    """A stem, one basic block per stage, global average pooling and a linear classifier."""

    def __init__(self, channels_in: int, num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels_in, CHANNELS[0], 3, 1, 1, bias=False), nn.BatchNorm2d(CHANNELS[0]), nn.ReLU(inplace=True)
        )
        stages, width = [], CHANNELS[0]
        for i, channels in enumerate(CHANNELS):
            stages.append(BasicBlock(width, channels, stride=1 if i == 0 else 2))
            width = channels
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def build(task: TaskInfo) -> nn.Module:
    """The ResNet for ``task``'s images (channels last on the wire, NCHW here) and classes."""
    channels = task.input_shape[-1] if task.channels_last else task.input_shape[0]
    return SmallResNet(channels, task.num_classes)
