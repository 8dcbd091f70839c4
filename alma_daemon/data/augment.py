"""Batched image augmentation (paper appendix B.1.2): random horizontal flips and 4-pixel padded crops.

Works on a whole mini-batch of channels-last images (N, H, W, C) on its device, in raw units
(zero padding = black, as torchvision pads before normalizing); no per-sample Python.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def flip_and_crop(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2, then crop it at a random offset after padding."""
    n, h, w, _ = x.shape
    device = generator.device
    flip = (torch.rand(n, generator=generator, device=device) < 0.5).to(x.device)
    x = torch.where(flip[:, None, None, None], x.flip(2), x)
    padded = F.pad(x, (0, 0, padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device).to(x.device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=device).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, :]
    return padded[torch.arange(n, device=x.device)[:, None, None], rows, cols]
