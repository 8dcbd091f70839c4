"""SM: a single model (paper section 4.1), fine-tuned from its previous parameters at each stage."""

from __future__ import annotations

from torch import nn

from alma_daemon.learners import register_learner
from alma_daemon.learners.base import SingleNetwork
from alma_daemon.models.backbones import build_backbone


@register_learner
class SingleModel(SingleNetwork):
    """One backbone (MLP or reduced VGG19-BN) of ``learner.width`` units per layer."""

    name = "sm"

    def build(self, arch: dict) -> nn.Module:
        return build_backbone(self.task, self.config.width)
