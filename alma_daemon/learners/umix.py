"""UMix: N members trained jointly as one model whose logits are the members' average (section 4.1)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from alma_daemon.learners.base import SingleNetwork
from alma_daemon.learners.configs import UniformMixtureConfig
from alma_daemon.learners.ens import independent_members


class LogitAverage(nn.Module):
    """The uniform mixture: mean of the members' logits, so training and prediction use one model."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


class UniformMixture(SingleNetwork):
    """``learner.members`` backbones whose averaged logits are trained end to end."""

    name = "umix"
    config_model = UniformMixtureConfig
    config: UniformMixtureConfig

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return LogitAverage(independent_members(self, range(self.config.members)))
