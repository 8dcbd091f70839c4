"""Ens for language modeling: ``learner.members`` Switch LMs trained independently, averaged in probability."""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import torch
from torch import nn

from alma_daemon.config import LearnerConfig
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import seeded_members
from alma_daemon.learners.configs import SwitchLMEnsembleConfig
from alma_daemon.learners.switch_lm import LanguageModel
from alma_daemon.training.distributed import train_members
from alma_daemon.training.loop import FitReport, Trainer


def mixture_log_proba(members: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """log of the members' mean next-token probability, computed stably in log space."""
    log_probas = torch.stack([m(x).logits.log_softmax(-1) for m in members])
    return log_probas.logsumexp(0) - math.log(len(members))


class SwitchLMEnsemble(LanguageModel):
    """``learner.members`` Switch LMs, each trained on the same data for the same number of steps."""

    name = "switch-lm-ens"
    config_model: ClassVar[type[LearnerConfig]] = SwitchLMEnsembleConfig
    model: nn.ModuleList

    def build(self, arch: dict[str, Any]) -> nn.Module:
        # switch-lm-gens shares this class but not the key: it builds its members from arch.
        members = cast(SwitchLMEnsembleConfig, self.config).members
        return nn.ModuleList(self.new_members(range(members)))

    def new_members(self, indices: range) -> list[nn.Module]:
        """The Switch LMs ``indices`` of the ensemble."""
        return seeded_members(self, indices, self.new_network)

    def members_to_train(self) -> range:
        return range(len(self.model))

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        members = [(i, self.model[i]) for i in self.members_to_train()]
        return train_members(
            members,
            lambda i, member: self.train_network(member, train, val, trainer, purpose=("member", i)),
            trainer.seed,
        )

    def log_proba(self, x: torch.Tensor) -> torch.Tensor:
        return mixture_log_proba(self.model, x)
