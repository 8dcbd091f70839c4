"""Several MLP backbones of one shape run as one batched model: member m's inputs through member m's weights.

An ensemble of five small MLPs is five small matrix products per layer, each too small to keep a
CPU or a GPU busy. :class:`StackedMLP` stacks the members' weights at every call (a copy of a
few hundred kilobytes) and runs each layer as one batched product (``torch.baddbmm``), so the
per-kernel costs are paid once for all members. Gradients flow back through the stack into each
member's own parameters: members keep their own parameters, optimizer state and checkpoint layout.

The backward pass of :class:`StackedLinear` computes the same products as the backward pass of
``F.linear`` (the weight gradient as ``grad^T @ input``, not ``input^T @ grad``), so a member's
gradients, hence its training, are bit for bit those of the member trained alone
(tests/test_stacked_members.py). Convolutional backbones are not stacked: their convolutions
already keep the cores busy, and grouped convolutions would change the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import torch
from torch import nn

from alma_daemon.models.backbones import Backbone

#: Layer types a stacked MLP is made of (Backbone MLPs: Flatten, then Linear and ReLU).
_STACKABLE = (nn.Flatten, nn.Linear, nn.ReLU)


def _leaf_layers(member: Backbone) -> list[nn.Module]:
    return [m for m in member.layers.modules() if not list(m.children())]


def stackable(members: Sequence[nn.Module]) -> TypeGuard[Sequence[Backbone]]:
    """Whether ``members`` are MLP backbones of identical shapes (what :func:`stacked_forward` runs)."""
    backbones = [m for m in members if isinstance(m, Backbone)]
    if not members or len(backbones) != len(members):
        return False
    plans = [_leaf_layers(m) for m in backbones]
    first = plans[0]
    if not all(isinstance(layer, _STACKABLE) for layer in first):
        return False
    if any(isinstance(layer, nn.Flatten) and (layer.start_dim, layer.end_dim) != (1, -1) for layer in first):
        return False
    for plan in plans[1:]:
        if len(plan) != len(first):
            return False
        for a, b in zip(first, plan):
            if type(a) is not type(b):
                return False
            if isinstance(a, nn.Linear) and (a.weight.shape != b.weight.shape or (a.bias is None) != (b.bias is None)):
                return False
    return all(not isinstance(layer, nn.Linear) or layer.bias is not None for layer in first)


class StackedLinear(torch.autograd.Function):
    """``out[m] = x[m] @ w[m]^T + b[m]`` for every member m, with ``F.linear``'s backward products."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad.bmm(weight) if ctx.needs_input_grad[0] else None
        # One product per member, as F.linear computes it: MKL's batched product of these shapes can
        # sum in another order than its single one for small outputs (a classifier's 10 rows).
        grad_weight = (
            torch.stack([g.t().mm(xm) for g, xm in zip(grad.unbind(), x.unbind())]) if ctx.needs_input_grad[1] else None
        )
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class StackedMLP:
    """Members of one shape run as one batched model; built once per set of members (a training stage)."""

    def __init__(self, members: Sequence[Backbone]):
        self.members = list(members)
        self.plan = list(zip(*(_leaf_layers(m) for m in members)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(M, B, classes)`` of member m on ``x[m]``, for standardized inputs ``x`` of shape ``(M, B, ...)``.

        ``x`` may be one batch expanded to all members (``x.expand(M, ...)``) for evaluation.
        """
        z = x
        for layers in self.plan:
            first = layers[0]
            if isinstance(first, nn.Flatten):
                z = z.flatten(2)
            elif isinstance(first, nn.ReLU):
                z = torch.relu(z)
            else:
                weight = torch.stack([layer.weight for layer in layers])
                bias = torch.stack([layer.bias for layer in layers])
                z = StackedLinear.apply(z, weight, bias)
        return z


def stacked_forward(members: Sequence[Backbone], x: torch.Tensor) -> torch.Tensor:
    """:class:`StackedMLP` of ``members`` on ``x``, once."""
    return StackedMLP(members)(x)
