"""Small containers for labeled examples, kept as whole tensors (no per-sample Python)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LabeledData:
    """Examples ``x`` (raw units, e.g. uint8 pixels, N x ...) and integer labels ``y`` (N)."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, index: torch.Tensor | slice) -> LabeledData:
        return LabeledData(self.x[index], self.y[index])

    @staticmethod
    def concat(parts: list[LabeledData]) -> LabeledData:
        if len(parts) == 1:
            return parts[0]
        return LabeledData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))
