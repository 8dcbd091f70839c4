"""UMix: N members trained jointly as one model whose logits are the members' average (section 4.1)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from alma_daemon.config.base import PLUGIN_SECTION, Int
from alma_daemon.learners import register_learner
from alma_daemon.learners.base import BackboneConfig, SingleNetwork
from alma_daemon.learners.ens import independent_members


class LogitAverage(nn.Module):
    """The uniform mixture: mean of the members' logits, so training and prediction use one model."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


@dataclass(config=PLUGIN_SECTION)
class UniformMixtureConfig(BackboneConfig):
    """UMix: the backbone's width and the number of members."""

    name: Literal["umix"] = "umix"
    members: Int = Field(default=5, gt=0, description="Backbones whose averaged logits are trained end to end.")


@register_learner
class UniformMixture(SingleNetwork):
    """``learner.members`` backbones whose averaged logits are trained end to end."""

    name = "umix"
    config_model = UniformMixtureConfig
    config: UniformMixtureConfig

    def build(self, arch: dict) -> nn.Module:
        return LogitAverage(independent_members(self, range(self.config.members)))
