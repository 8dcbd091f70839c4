"""gEns for language modeling: start as one Switch LM, add ``learner.grow_members`` per growth, train only new ones.

The first stage trains the first member; a growth before any member was trained adds nothing (the
paper's gEns has one member at t0, two at t1, ...). A stage without growth fine-tunes the members
added at the last growth (the newest ``grow_members``), as image gEns does, so every stage learns
from its data.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass
from torch import nn

from alma_daemon.config.base import PLUGIN_SECTION, Int
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import register_learner
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.learners.switch_lm import LanguageModelConfig
from alma_daemon.learners.switch_lm_ens import SwitchLMEnsemble, member_networks
from alma_daemon.training.loop import Trainer


@dataclass(config=PLUGIN_SECTION)
class GrowingSwitchLMEnsembleConfig(LanguageModelConfig):
    """switch-lm-gens: the size of each LM and the members added per growth step."""

    name: Literal["switch-lm-gens"] = "switch-lm-gens"
    #: Members added per growth step.
    grow_members: Int = Field(default=1, gt=0)


@register_learner
class GrowingSwitchLMEnsemble(GrowsOnceTrained, SwitchLMEnsemble):
    """A Switch LM ensemble that grows by whole members; ``arch["trained"]`` counts the trained ones and
    ``arch["frozen"]`` the ones kept fixed since the last growth."""

    name = "switch-lm-gens"
    config_model = GrowingSwitchLMEnsembleConfig
    config: GrowingSwitchLMEnsembleConfig

    def initial_architecture(self) -> dict:
        return {"members": 1, "trained": 0, "frozen": 0}

    def build(self, arch: dict) -> nn.Module:
        return nn.ModuleList(member_networks(self, range(arch["members"])))

    def members_to_train(self) -> range:
        # Checkpoints saved before "frozen" was kept grew one member at a time: all but the newest.
        return range(self.arch.get("frozen", len(self.model) - 1), len(self.model))

    def newest_part_trained(self) -> bool:
        return self.arch["trained"] >= len(self.model)

    def mark_trained(self) -> None:
        self.arch["trained"] = len(self.model)

    def mark_untrained(self) -> None:
        # Retraining from scratch re-draws every member: all train again.
        self.arch["trained"] = self.arch["frozen"] = 0

    def growth_skipped(self) -> dict:
        return {"added": 0, "members": len(self.model)}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> dict:
        count = len(self.model)
        new = member_networks(self, range(count, count + self.config.grow_members))
        self.model.extend(m.to(self.device) for m in new)
        self.arch["members"] = len(self.model)
        self.arch["frozen"] = count
        return {"added": len(new), "members": len(self.model)}
