"""Batched image augmentation (paper appendix B.1.2): random horizontal flips and 4-pixel padded crops.

Works on a whole mini-batch of channels-last images (N, H, W, C) on its device, in raw units
(zero padding = black, as torchvision pads before normalizing); no per-sample Python.
:class:`PixelRows` gives the same crops of a whole stage in one gather per batch (what the training
loop uses); :func:`flip_and_crop` is the textbook form, on a batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def draw_flips_and_offsets(
    n: int, generator: torch.Generator, padding: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image: flipped or not, then the crop's row and column offsets into the padded image (on ``device``)."""
    drawn_on = generator.device
    flip = (torch.rand(n, generator=generator, device=drawn_on) < 0.5).to(device)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=drawn_on).to(device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=drawn_on).to(device)
    return flip, dy, dx


def flip_and_crop(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2, then crop it at a random offset after padding."""
    n, h, w, _ = x.shape
    flip, dy, dx = draw_flips_and_offsets(n, generator, padding, x.device)
    x = torch.where(flip[:, None, None, None], x.flip(2), x)
    padded = F.pad(x, (0, 0, padding, padding, padding, padding))
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, :]
    return padded[torch.arange(n, device=x.device)[:, None, None], rows, cols]


class PixelRows:
    """A stage's channels-last images as one row per pixel, plus one row of padding; a batch is one gather.

    :meth:`flip_and_crop` gives, for the same generator state, the very values :func:`flip_and_crop`
    gives on the gathered batch: a flip of the padded image is the padded flip (the padding is
    symmetric), so each output pixel is one source pixel or the padding, found by index arithmetic,
    and the whole batch is a single ``index_select`` instead of a gather, a flip, a pad and a crop.
    ``standardize_`` (in place, elementwise) turns the rows into float32 model inputs once, the
    padding row (black) included: the same floats as cropping raw images and standardizing them.
    """

    def __init__(self, images: torch.Tensor, standardize_: Callable[[torch.Tensor], torch.Tensor] | None = None):
        n, self.height, self.width, channels = images.shape
        self.pad_row = n * self.height * self.width
        dtype = images.dtype if standardize_ is None else torch.float32
        self.rows = torch.zeros(self.pad_row + 1, channels, dtype=dtype, device=images.device)
        self.images().copy_(images)
        if standardize_ is not None:
            standardize_(self.rows)
        self.row_range = torch.arange(self.height, device=images.device)
        self.col_range = torch.arange(self.width, device=images.device)

    def images(self) -> torch.Tensor:
        """All images, (N, H, W, C), as a view of the rows."""
        return self.rows[: self.pad_row].view(-1, self.height, self.width, self.rows.shape[1])

    def flip_and_crop(self, index: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
        """Images ``index``, each flipped with probability 1/2 and cropped at a random offset after padding."""
        n, h, w = len(index), self.height, self.width
        flip, dy, dx = draw_flips_and_offsets(n, generator, padding, index.device)
        rows = (dy - padding)[:, None] + self.row_range  # source rows, (n, h); out of range = padding
        cols = (dx - padding)[:, None] + self.col_range  # columns of the flipped-or-not image, (n, w)
        cols = torch.where(flip[:, None], w - 1 - cols, cols)
        inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
        pixel = (index[:, None, None] * h + rows[:, :, None]) * w + cols[:, None, :]
        pixel = torch.where(inside, pixel, self.pad_row)
        return self.rows.index_select(0, pixel.view(-1)).view(n, h, w, -1)
