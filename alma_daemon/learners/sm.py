"""SM: a single model (paper section 4.1), fine-tuned from its previous parameters at each stage."""

from __future__ import annotations

from typing import Any

from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import SingleNetwork, build_network
from alma_daemon.learners.configs import SingleModelConfig
from alma_daemon.models.backbones import Backbone, linear_layers
from alma_daemon.training.linear_fit import fit_linear
from alma_daemon.training.loop import FitReport, Trainer


class SingleModel(SingleNetwork):
    """One network: the backbone (MLP or reduced VGG19-BN) of ``learner.width`` units per layer, or ``learner.model``;
    under ``train.linear_candidate``, a stage may keep a linear model of the inputs instead."""

    name = "sm"
    config_model = SingleModelConfig
    config: SingleModelConfig
    linear_architecture = {"form": "linear"}

    def build(self, arch: dict[str, Any]) -> nn.Module:
        if arch == self.linear_architecture:
            return Backbone(self.task, linear_layers(self.task))
        return build_network(self.task, self.config)

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        if self.is_linear:
            return fit_linear(self.model, train, self.training_loss.objective, self.device)
        return super().fit(train, val, trainer)
