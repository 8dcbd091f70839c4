"""Backbones of the paper (appendix B): an MLP for MNIST and a reduced VGG19-BN for CIFAR-10.

Every backbone starts with :class:`Normalize`, so a model takes inputs in raw units (0-255 pixels,
channels-last images as stored on the wire) and serving needs no separate preprocessing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from alma_daemon.data import yeo_johnson
from alma_daemon.data.datasets import TaskInfo

#: VGG19's layer plan: conv layers per block, a max-pool after each block (Wu et al. 2020 reduce
#: every conv to the same channel count).
VGG19_BLOCKS = (2, 2, 4, 4, 4)


def is_image_task(task: TaskInfo) -> bool:
    """Inputs with a channel axis (colour images) get the VGG backbone, everything else the MLP."""
    return len(task.input_shape) == 3


def image_channels(task: TaskInfo) -> int:
    """Channels of an image task's inputs (the last axis of channels-last images, else the first)."""
    return task.input_shape[-1] if task.channels_last else task.input_shape[0]


class Normalize(nn.Module):
    """Raw inputs (0-255 pixels, channels-last images as on the wire, or numeric features) -> standardized
    floats (NCHW images), as the task's :attr:`~TaskInfo.normalization` says.

    The work is split in two so that a training loop can standardize a stage's data once
    (:meth:`standardize`, elementwise, in the data's own layout) and hand the model batches that
    :meth:`arrange` only re-views; inside :func:`inputs_standardized_outside` the module then
    passes its input through.
    """

    mean: torch.Tensor
    std: torch.Tensor
    power: torch.Tensor | None

    def __init__(self, task: TaskInfo):
        super().__init__()
        self.channels_last = task.channels_last
        self.register_buffer("mean", torch.zeros(1), persistent=False)
        self.register_buffer("std", torch.ones(1), persistent=False)
        self.register_buffer("power", None, persistent=False)
        self.set_statistics(task)
        self.passthrough = False

    def set_statistics(self, task: TaskInfo) -> None:
        """Take ``task``'s statistics: per channel on the 0-1 scale for pixels, per feature in raw units
        for standardized features (identity while a standardizing task awaits them, and for ``none``)."""
        mean = torch.tensor(task.mean or (0.0,), dtype=torch.float32)
        std = torch.tensor(task.std or (1.0,), dtype=torch.float32)
        if task.pixels:
            mean, std = mean * 255.0, std * 255.0
            if is_image_task(task) and not self.channels_last:
                mean, std = mean.reshape(-1, 1, 1), std.reshape(-1, 1, 1)
        elif task.normalization == "standardize" and task.mean:
            mean, std = mean.reshape(task.input_shape), std.reshape(task.input_shape)
        else:
            mean, std = torch.zeros(1), torch.ones(1)
        device = self.mean.device
        self.mean = mean.to(device)
        self.std = std.to(device)
        transformed = task.normalization == "standardize" and task.power
        power = torch.tensor(task.power, dtype=torch.float32).reshape(task.input_shape) if transformed else None
        self.power = None if power is None else power.to(device)

    def standardize(self, x: torch.Tensor) -> torch.Tensor:
        """Raw units -> standardized floats, same layout (elementwise: rows may be gathered before or after).

        Integer pixels are converted inside the subtraction (exactly, as ``x.float()`` would) and the
        division runs in place: two passes over the data instead of three, the same floats.
        """
        if x.is_floating_point():
            x = x.float()
        if self.power is not None:
            x = yeo_johnson.transform(x.float(), self.power)
        return (x - self.mean).div_(self.std)

    def standardize_(self, z: torch.Tensor) -> torch.Tensor:
        """:meth:`standardize` in place, on raw values already in a float32 tensor (the same floats)."""
        if self.power is not None:
            z.copy_(yeo_johnson.transform(z, self.power))
        return z.sub_(self.mean).div_(self.std)

    def arrange(self, z: torch.Tensor) -> torch.Tensor:
        """Standardized inputs -> the layout the layers take (a view: channels-last images become NCHW)."""
        return z.permute(0, 3, 1, 2) if self.channels_last else z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.passthrough:
            return x
        return self.arrange(self.standardize(x))

    def same_transform(self, other: Normalize) -> bool:
        return (
            self.channels_last == other.channels_last
            and torch.equal(self.mean, other.mean)
            and torch.equal(self.std, other.std)
            and (self.power is None) == (other.power is None)
            and (self.power is None or other.power is None or torch.equal(self.power, other.power))
        )


@contextmanager
def inputs_standardized_outside(net: nn.Module) -> Iterator[Normalize | None]:
    """Inside, every :class:`Normalize` of ``net`` passes its input through; yields the transform to apply.

    The caller then feeds ``normalize.arrange(batch of normalize.standardize(data))``, the same floats
    in the same layout as ``normalize(raw batch)``. Yields None (and changes nothing) when ``net``
    has no Normalize, or several that do not agree.
    """
    found = [m for m in net.modules() if isinstance(m, Normalize)]
    if not found or not all(found[0].same_transform(m) for m in found[1:]):
        yield None
        return
    for m in found:
        m.passthrough = True
    try:
        yield found[0]
    finally:
        for m in found:
            m.passthrough = False


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


def linear_layers(task: TaskInfo) -> list[nn.Module]:
    """A linear model of the (normalized) inputs: a logistic regression for a classifier, a linear regression
    for a regression; the linear form of ``train.linear_candidate``."""
    inputs = 1
    for d in task.input_shape:
        inputs *= d
    return [nn.Flatten(), nn.Linear(inputs, task.num_classes)]


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
    channels = image_channels(task)
    layers: list[nn.Module] = []
    for convs in VGG19_BLOCKS:
        block: list[nn.Module] = []
        for _ in range(convs):
            block.append(conv_bn_relu(channels, width))
            channels = width
        block.append(nn.MaxPool2d(2))
        layers.append(nn.Sequential(*block))
    layers.append(nn.Sequential(nn.Flatten(), nn.Linear(width, task.num_classes)))
    return layers


class Backbone(nn.Module):
    """Normalization followed by a list of layers; maps raw inputs to logits."""

    normalize: Normalize
    layers: nn.Sequential

    def __init__(self, task: TaskInfo, layers: list[nn.Module]):
        super().__init__()
        self.normalize = Normalize(task)
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.normalize(x))


def backbone_layers(task: TaskInfo, width: int) -> list[nn.Module]:
    """The layers of the task's backbone: VGG's blocks for colour images, the MLP's for flat/grayscale inputs."""
    return vgg_layers(task, width) if is_image_task(task) else mlp_layers(task, width)


def build_backbone(task: TaskInfo, width: int) -> Backbone:
    """The paper's backbone for the task (appendix B), from raw inputs to logits."""
    return Backbone(task, backbone_layers(task, width))
