"""Randomness drawn in training (dropout masks, hard gates' samples) from a generator the training
loop hands over, not torch's global RNG.

The global RNG is shared by every thread of a process: the daemon's publisher builds models (seeded,
under ``fork_rng``) while the main thread trains, so a draw from it would depend on timing. With a
generator of its own, a training stage draws the same numbers in the daemon as in the simulator,
and an ensemble member the same numbers whichever rank trains it.
"""

from __future__ import annotations

import torch
from torch import nn


class DrawsNoise(nn.Module):
    """A module that draws random numbers in training from ``self.generator`` (the global RNG until
    the trainer sets one with :func:`draw_noise_from`)."""

    generator: torch.Generator | None = None

    @property
    def draws_noise(self) -> bool:
        """Whether training draws from ``self.generator`` at all (a dropout of 0 draws nothing)."""
        return True


class SeededDropout(DrawsNoise):
    """``nn.Dropout`` drawing its masks from ``self.generator``."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    @property
    def draws_noise(self) -> bool:
        return self.p > 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=self.generator, device=x.device, dtype=x.dtype) >= self.p
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def draw_noise_from(net: nn.Module, generator: torch.Generator) -> None:
    """Every :class:`DrawsNoise` module of ``net`` draws from ``generator`` from now on."""
    for module in net.modules():
        if isinstance(module, DrawsNoise):
            module.generator = generator
