"""Dropout whose masks come from a generator the training loop hands over, not torch's global RNG.

The global RNG is shared by every thread of a process: the daemon's publisher builds models (seeded,
under ``fork_rng``) while the main thread trains, so a mask drawn from it would depend on timing.
With a generator of its own, a training stage draws the same masks in the daemon as in the simulator,
and an ensemble member the same masks whichever rank trains it.
"""

from __future__ import annotations

import torch
from torch import nn


class SeededDropout(nn.Module):
    """``nn.Dropout`` drawing from ``self.generator`` (the global RNG until the trainer sets one)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=self.generator, device=x.device, dtype=x.dtype) >= self.p
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def draw_dropout_from(net: nn.Module, generator: torch.Generator) -> None:
    """Every :class:`SeededDropout` of ``net`` draws its masks from ``generator`` from now on."""
    for module in net.modules():
        if isinstance(module, SeededDropout):
            module.generator = generator
