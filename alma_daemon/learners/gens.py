"""gEns: a growing ensemble (paper section 4.2).

Members are independent backbones, each initialized from its own seed as in Ens. The ensemble
starts with one member; each growth step freezes the current members and adds
``learner.grow_members`` (k) fresh ones, and training updates only the members added since the
last growth. Predictions average the members' probabilities, so inference cost grows with the
number of members.

When to grow: the first stage trains the initial member; growth adds members from stage 2 on
(the engine asks to grow before the first stage too, when there is nothing trained to freeze).
Without a growth step (``policy.grow_every`` > 1) a stage fine-tunes the newest members.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from alma_daemon.config.base import PLUGIN_SECTION, Int
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import register_learner
from alma_daemon.learners.base import BackboneConfig, Learner
from alma_daemon.learners.ens import average_member_proba, independent_members, train_independent_members
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.training.loop import FitReport, Trainer


@dataclass(config=PLUGIN_SECTION)
class GrowingEnsembleConfig(BackboneConfig):
    """gEns: the backbone's width and the members added per growth step."""

    name: Literal["gens"] = "gens"
    #: Members added per growth step (k).
    grow_members: Int = Field(default=1, gt=0)


@register_learner
class GrowingEnsemble(GrowsOnceTrained, Learner):
    """Independent members; growth freezes them and adds k new ones, the only ones trained afterwards.

    ``arch``: ``{"members": count, "frozen": members kept fixed (the first ones), "trained": whether
    the trainable members have trained since they were added}``.
    """

    name = "gens"
    config_model = GrowingEnsembleConfig
    model: nn.ModuleList
    config: GrowingEnsembleConfig

    def initial_architecture(self) -> dict:
        return {"members": 1, "frozen": 0, "trained": False}

    def build(self, arch: dict) -> nn.Module:
        return nn.ModuleList(independent_members(self, arch["members"]))

    def mark_untrained(self) -> None:
        # Retraining from scratch re-draws every member, frozen ones included: all train again.
        self.arch = {**self.arch, "frozen": 0, "trained": False}

    def growth_skipped(self) -> dict:
        return {"added": 0, "members": self.arch["members"]}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> dict:
        """Freeze every member and add k freshly initialized ones."""
        count = self.arch["members"]
        added = self.config.grow_members
        self.model.extend(m.to(self.device) for m in independent_members(self, added, first=count))
        self.arch = {"members": count + added, "frozen": count, "trained": False}
        return {"added": added, "members": count + added, "frozen": count}

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        """Train the non-frozen members, each independently (stacked where they allow it, as in Ens)."""
        trainable = [(i, self.model[i]) for i in range(self.arch["frozen"], self.arch["members"])]
        report = train_independent_members(trainable, trainer, train, val)
        self.mark_trained()
        return report

    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        return average_member_proba(self.model, x)
