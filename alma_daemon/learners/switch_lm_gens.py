"""gEns for language modeling: start as one Switch LM, add ``learner.grow_members`` per growth, train only new ones.

The first stage trains the first member; a growth before any member was trained adds nothing (the
paper's gEns has one member at t0, two at t1, ...). A stage without growth fine-tunes the newest
member, so every stage learns from its data.
"""

from __future__ import annotations

from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import register_learner
from alma_daemon.learners.switch_lm_ens import SwitchLMEnsemble, member_networks
from alma_daemon.training.loop import FitReport, Trainer


@register_learner
class GrowingSwitchLMEnsemble(SwitchLMEnsemble):
    """A Switch LM ensemble that grows by whole members; ``arch["trained"]`` counts the trained ones."""

    name = "switch-lm-gens"
    grows = True

    def initial_architecture(self) -> dict:
        return {"members": 1, "trained": 0}

    def build(self, arch: dict) -> nn.Module:
        return nn.ModuleList(member_networks(self, range(arch["members"])))

    def members_to_train(self) -> range:
        return range(min(self.arch["trained"], len(self.model) - 1), len(self.model))

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        report = super().fit(train, val, trainer)
        self.arch["trained"] = len(self.model)
        return report

    def grow(self, val: LabeledData, trainer: Trainer) -> dict:
        count = len(self.model)
        if self.arch["trained"] < count:
            return {"added": 0, "members": count, "reason": "the newest member is not trained yet"}
        new = member_networks(self, range(count, count + self.config.grow_members))
        self.model.extend(m.to(self.device) for m in new)
        self.arch["members"] = len(self.model)
        return {"added": len(new), "members": len(self.model)}

    def reinitialize(self, seed: int) -> None:
        self.arch["trained"] = 0
        super().reinitialize(seed)
