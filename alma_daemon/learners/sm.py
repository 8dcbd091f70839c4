"""SM: a single model (paper section 4.1), fine-tuned from its previous parameters at each stage."""

from __future__ import annotations

import torch
from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import register_learner
from alma_daemon.learners.base import Learner
from alma_daemon.models.backbones import build_backbone
from alma_daemon.training.loop import FitReport, Trainer


@register_learner
class SingleModel(Learner):
    """One backbone (MLP or reduced VGG19-BN) of ``learner.width`` units per layer."""

    name = "sm"

    def build(self, arch: dict) -> nn.Module:
        return build_backbone(self.task, self.config.width)

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        return trainer.fit(self.model, train, val)

    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).softmax(1)
