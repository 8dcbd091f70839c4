"""SM: a single model (paper section 4.1), fine-tuned from its previous parameters at each stage."""

from __future__ import annotations

from typing import Any

from torch import nn

from alma_daemon.learners.base import SingleNetwork, build_network
from alma_daemon.learners.configs import SingleModelConfig


class SingleModel(SingleNetwork):
    """One network: the backbone (MLP or reduced VGG19-BN) of ``learner.width`` units per layer, or ``learner.model``."""

    name = "sm"
    config_model = SingleModelConfig
    config: SingleModelConfig

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return build_network(self.task, self.config)
