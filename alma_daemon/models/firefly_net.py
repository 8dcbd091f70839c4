"""A network that Firefly grows wider and deeper: the paper's MLP or reduced VGG19-BN, made growable.

Each hidden layer is an op (a Linear layer, or a 3x3 convolution followed by BatchNorm), a ReLU and,
in VGG, an optional 2x2 max-pool. A *unit* is a hidden neuron (MLP) or a feature map (VGG): its
incoming weights are a row of the layer's op, its outgoing weights a column of the next op (the
*consumer*: the next hidden layer, or the classifier). The architecture is JSON,
``{"widths": [units per hidden layer], "pools": [max-pool after the layer?]}``, and every growth
operation below keeps the modules in step with it, so a spec rebuilds a grown network exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.models.backbones import VGG19_BLOCKS, Normalize, image_channels, is_image_task


def input_size(task: TaskInfo) -> int:
    """Inputs of the first hidden layer: image channels (VGG) or values per example (MLP)."""
    if is_image_task(task):
        return image_channels(task)
    return math.prod(task.input_shape)


def initial_architecture(task: TaskInfo, width: int) -> dict[str, Any]:
    """The SM backbone: 2 hidden layers (MLP) or 16 conv layers with a pool after each block (VGG)."""
    if is_image_task(task):
        pools = [i == convs - 1 for convs in VGG19_BLOCKS for i in range(convs)]
        return {"widths": [width] * len(pools), "pools": pools}
    return {"widths": [width, width], "pools": [False, False]}


class GrowableLayer(nn.Module):
    """op (Linear, or 3x3 conv + BatchNorm) -> ReLU -> optional 2x2 max-pool."""

    op: nn.Linear | nn.Conv2d
    norm: nn.BatchNorm2d | nn.Identity
    pool: nn.MaxPool2d | nn.Identity

    def __init__(self, conv: bool, fan_in: int, width: int, pool: bool):
        super().__init__()
        self.op = nn.Conv2d(fan_in, width, 3, padding=1, bias=False) if conv else nn.Linear(fan_in, width)
        self.norm = nn.BatchNorm2d(width) if conv else nn.Identity()
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    @property
    def width(self) -> int:
        return self.op.weight.shape[0]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.op(z))))

    def unit_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer with one entry per unit (weight rows, bias, BatchNorm), by name."""
        named = [*self.named_parameters(), *self.named_buffers()]
        return {name: t for name, t in named if t.dim() >= 1 and t.shape[0] == self.width}


def apply_op(op: nn.Module, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``op``'s linear map (without bias) with another weight tensor: how candidate units are probed."""
    if isinstance(op, nn.Conv2d):
        return F.conv2d(z, weight, padding=1)
    return F.linear(z.flatten(1), weight)


def _extend(module: nn.Module, name: str, extra: torch.Tensor, dim: int) -> None:
    """Concatenate ``extra`` to the parameter or buffer ``name`` (dotted) along ``dim``."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    old = getattr(owner, attr)
    new = torch.cat([old.detach(), extra.to(old)], dim)
    setattr(owner, attr, nn.Parameter(new) if isinstance(old, nn.Parameter) else new)


def _sync_sizes(module: nn.Module) -> None:
    """Keep the size attributes (shown by repr, used by BatchNorm) in step with the grown tensors."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.out_features, m.in_features = m.weight.shape
        elif isinstance(m, nn.Conv2d):
            m.out_channels, m.in_channels = m.weight.shape[:2]
        elif isinstance(m, nn.BatchNorm2d):
            m.num_features = m.weight.shape[0]


class GrowableNet(nn.Module):
    """Normalization, growable hidden layers and a linear classifier; maps raw inputs to logits."""

    normalize: Normalize
    hidden: nn.ModuleList
    classifier: nn.Linear

    def __init__(self, task: TaskInfo, arch: dict[str, Any]):
        super().__init__()
        conv = is_image_task(task)
        fan_in = input_size(task)
        self.normalize = Normalize(task)
        self.hidden = nn.ModuleList()
        for width, pool in zip(arch["widths"], arch["pools"]):
            self.hidden.append(GrowableLayer(conv, fan_in, width, pool))
            fan_in = width
        self.classifier = nn.Linear(fan_in, task.num_classes)

    def layer(self, index: int) -> GrowableLayer:
        """Hidden layer ``index``."""
        layer = self.hidden[index]
        assert isinstance(layer, GrowableLayer)  # hidden holds nothing else
        return layer

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """Raw inputs -> the first hidden layer's input (flattened for the MLP)."""
        z = self.normalize(x)
        return z if isinstance(self.hidden[0].op, nn.Conv2d) else z.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.stem(x)
        for layer in self.hidden:
            z = layer(z)
        return self.classifier(z.flatten(1))

    def architecture(self) -> dict[str, Any]:
        return {
            "widths": [layer.width for layer in self.hidden],
            "pools": [isinstance(layer.pool, nn.MaxPool2d) for layer in self.hidden],
        }

    def consumer(self, index: int) -> nn.Linear | nn.Conv2d:
        """The op that reads hidden layer ``index``'s units (whose columns are their outgoing weights)."""
        return self.layer(index + 1).op if index + 1 < len(self.hidden) else self.classifier

    # -- growth operations (each keeps the function, up to the perturbations its caller asks for) ------
    @torch.no_grad()
    def add_units(self, index: int, units: dict[str, torch.Tensor], columns: torch.Tensor) -> None:
        """Append units to hidden layer ``index``.

        ``units`` maps each of the layer's per-unit tensors (see :meth:`GrowableLayer.unit_tensors`)
        to the new units' values, ``op.weight`` rows over the layer's current inputs included;
        ``columns`` are their outgoing weights in the consumer.
        """
        layer = self.layer(index)
        for name in layer.unit_tensors():
            _extend(layer, name, units[name], 0)
        _extend(self.consumer(index), "weight", columns, 1)
        _sync_sizes(self)

    @torch.no_grad()
    def add_new_units(
        self,
        index: int,
        rows: torch.Tensor,
        columns: torch.Tensor,
        stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Append fresh units: incoming weights ``rows``, no bias, outgoing weights ``columns``.

        In VGG each gets a BatchNorm that standardizes its feature map, given ``stats``, the (mean,
        variance) of its conv output on some data.
        """
        count = rows.shape[0]
        units = {
            "op.weight": rows,
            "op.bias": torch.zeros(count),
            "norm.weight": torch.ones(count),
            "norm.bias": torch.zeros(count),
        }
        if stats is not None:
            units["norm.running_mean"], units["norm.running_var"] = stats
        self.add_units(index, units, columns)

    @torch.no_grad()
    def split_units(self, index: int, units: torch.Tensor, delta: torch.Tensor) -> None:
        """Split each of ``units`` into incoming weights ``w + delta`` and ``w - delta``, halving its outgoing ones.

        The two offspring keep the unit's bias and BatchNorm state, so with ``delta = 0`` the
        function is unchanged; the change is second order in ``delta`` (Liu et al. 2019).
        """
        layer, consumer = self.layer(index), self.consumer(index)
        offspring = {name: t[units].clone() for name, t in layer.unit_tensors().items()}
        offspring["op.weight"] -= delta
        layer.op.weight[units] += delta
        consumer.weight[:, units] /= 2
        self.add_units(index, offspring, consumer.weight[:, units].clone())

    @torch.no_grad()
    def insert_layer(
        self, index: int, weight: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> None:
        """Insert a square layer after hidden layer ``index`` whose op has ``weight`` (near the identity).

        A ReLU of non-negative inputs (every hidden layer's output) is the identity, so an identity
        ``weight`` keeps the function. A conv layer's BatchNorm is calibrated to pass its input
        through: given ``stats``, the (mean, variance) per channel of the op's output, it normalizes
        and then undoes the normalization, exactly at test time and up to batch noise in training.
        """
        previous = self.layer(index)
        conv = isinstance(previous.op, nn.Conv2d)
        if conv and stats is None:
            raise ValueError("a conv layer's BatchNorm needs the statistics of its input to pass it through")
        layer = GrowableLayer(conv, previous.width, previous.width, pool=False).to(previous.op.weight.device)
        layer.op.weight.copy_(weight)
        if conv:
            assert stats is not None  # refused above
            mean, var = stats
            norm = layer.norm
            # A conv layer's norm is a BatchNorm2d that tracks running statistics (the default).
            assert isinstance(norm, nn.BatchNorm2d) and norm.running_mean is not None and norm.running_var is not None
            norm.running_mean.copy_(mean)
            norm.running_var.copy_(var)
            norm.weight.copy_((var + norm.eps).sqrt())
            norm.bias.copy_(mean)
        else:
            assert layer.op.bias is not None  # a Linear op has a bias
            layer.op.bias.zero_()
        self.hidden.insert(index + 1, layer)

    def identity_weight(self, index: int) -> torch.Tensor:
        """The op weight that makes a layer inserted after hidden layer ``index`` the identity map."""
        previous = self.layer(index)
        eye = torch.eye(previous.width, device=previous.op.weight.device)
        if isinstance(previous.op, nn.Conv2d):
            return F.pad(eye[:, :, None, None], (1, 1, 1, 1))
        return eye


def grown_architecture(
    arch: dict[str, Any], added: dict[int, int], inserted_after: int | None = None
) -> dict[str, Any]:
    """``arch`` after adding ``added[i]`` units to hidden layer ``i``, then a layer after ``inserted_after``."""
    widths = [w + added.get(i, 0) for i, w in enumerate(arch["widths"])]
    pools = list(arch["pools"])
    if inserted_after is not None:
        widths.insert(inserted_after + 1, widths[inserted_after])
        pools.insert(inserted_after + 1, False)
    return {"widths": widths, "pools": pools}


def parameter_count(task: TaskInfo, arch: dict[str, Any]) -> int:
    """Parameters of :class:`GrowableNet` ``(task, arch)``, without building it (growth prices many variants)."""
    conv = is_image_task(task)
    kernel, per_unit = (9, 2) if conv else (1, 1)  # 3x3 kernels and BatchNorm's scale and shift, or a bias
    fan_in = input_size(task)
    total = 0
    for width in arch["widths"]:
        total += fan_in * width * kernel + per_unit * width
        fan_in = width
    return total + (fan_in + 1) * task.num_classes
