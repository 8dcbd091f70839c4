"""Several MLP backbones of one shape run as one batched model: member m's inputs through member m's weights.

An ensemble of five small MLPs is five small matrix products per layer, each too small to keep a
CPU or a GPU busy. :class:`StackedMLP` stacks the members' weights once, one tensor per layer, and
runs each layer as one batched product (``torch.baddbmm``), so the per-kernel costs are paid once
for all members. Training steps the stacked tensors (one optimizer over all members, which is exact
since the optimizers are elementwise) while each member's parameters are views into them, so the
members keep their own parameters and checkpoint layout.

The backward pass of :class:`StackedLinear` computes the same products as the backward pass of
``F.linear`` (the weight gradient as ``grad^T @ input``, not ``input^T @ grad``), so a member's
gradients, hence its training, are bit for bit those of the member trained alone
(tests/test_stacked_members.py). Convolutional backbones are not stacked: their convolutions
already keep the cores busy, and grouped convolutions would change the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import torch
from torch import nn

from alma_daemon.models.backbones import Backbone

#: Layer types a stacked MLP is made of (Backbone MLPs: Flatten, then Linear and ReLU).
_STACKABLE = (nn.Flatten, nn.Linear, nn.ReLU)


def _leaf_layers(member: Backbone) -> list[nn.Module]:
    return [m for m in member.layers.modules() if not list(m.children())]


def stackable(members: Sequence[nn.Module]) -> TypeGuard[Sequence[Backbone]]:
    """Whether ``members`` are MLP backbones of identical shapes (what :class:`StackedMLP` runs)."""
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
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = grad.bmm(weight) if ctx.needs_input_grad[0] else None
        # One product per member, as F.linear computes it: MKL's batched product of these shapes can
        # sum in another order than its single one for small outputs (a classifier's 10 rows).
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = weight.new_empty(weight.shape)
            for g, xm, out in zip(grad.unbind(), x.unbind(), grad_weight.unbind()):
                torch.mm(g.t(), xm, out=out)
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


class StackedMLP:
    """Members of one shape run as one batched model, its weights stacked once: one tensor per layer.

    :meth:`parameters` are the stacked tensors (a layer's weights of every member, ``(M, out, in)``),
    leaves that an optimizer can step as they are. :meth:`share_with_members` then makes each
    member's parameters views into them, so the members see every step without a copy per call and
    their checkpoints, early stopping and optimizer-free uses keep working on the member alone;
    :meth:`unshare` gives each member its own storage back.
    """

    def __init__(self, members: Sequence[Backbone]):
        self.members = list(members)
        self.plan = list(zip(*(_leaf_layers(m) for m in members)))
        self.stacked: list[tuple[nn.Parameter, nn.Parameter] | None] = [
            (_stack([layer.weight for layer in layers]), _stack([layer.bias for layer in layers]))
            if isinstance(layers[0], nn.Linear)
            else None
            for layers in self.plan
        ]

    def parameters(self) -> list[nn.Parameter]:
        return [tensor for pair in self.stacked if pair is not None for tensor in pair]

    def share_with_members(self) -> None:
        """Member m's weights and biases become views of slice m of the stacked tensors (as they are now)."""
        for layers, pair in zip(self.plan, self.stacked):
            if pair is not None:
                weight, bias = pair
                for m, layer in enumerate(layers):
                    layer.weight.data, layer.bias.data = weight.detach()[m], bias.detach()[m]

    def unshare(self) -> None:
        """Every member's parameters in a storage of their own again (same values)."""
        for member in self.members:
            for p in member.parameters():
                p.data = p.data.clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(M, B, classes)`` of member m on ``x[m]``, for standardized inputs ``x`` of shape ``(M, B, ...)``.

        ``x`` may be one batch expanded to all members (``x.expand(M, ...)``) for evaluation.
        """
        z = x
        for layers, pair in zip(self.plan, self.stacked):
            if pair is not None:
                z = StackedLinear.apply(z, *pair)
            elif isinstance(layers[0], nn.Flatten):
                z = z.flatten(2)
            else:
                z = torch.relu(z)
        return z


def _stack(tensors: Sequence[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))
