"""Ens: N independent members, each trained on the same data; predictions average probabilities (a
regression: the members' predictions).

MLP members train together as one stacked model (:mod:`alma_daemon.training.members`), each with its
own initialization, shuffling and early stopping, with the results of training them one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
from torch import nn

from alma_daemon.config import LearnerConfig
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import Learner, build_network, seeded_members
from alma_daemon.learners.configs import BackboneConfig, EnsembleConfig
from alma_daemon.training.distributed import train_members
from alma_daemon.training.loop import FitReport, Trainer
from alma_daemon.training.losses import TaskLoss
from alma_daemon.training.members import stacked_fitter


def independent_members(learner: Learner, indices: range) -> list[nn.Module]:
    """The networks ``indices`` of an ensemble (backbones, or ``learner.model``'s)."""
    return seeded_members(learner, indices, lambda: build_network(learner.task, cast(BackboneConfig, learner.config)))


def member_fitter(
    trainer: Trainer, train: LabeledData, val: LabeledData, loss: TaskLoss
) -> Callable[[int, nn.Module], FitReport]:
    """Trains one member on the stage's data with its own shuffling (``purpose`` = its index)."""
    return lambda index, member: trainer.fit(
        member, train, val, purpose=("member", index), objective=loss.objective, validate=loss.validate
    )


def train_independent_members(
    members: list[tuple[int, nn.Module]], trainer: Trainer, train: LabeledData, val: LabeledData, loss: TaskLoss
) -> FitReport:
    """Train ``(index, member)`` pairs on ``loss``, stacked into one batched model where they allow it,
    spread over ranks."""
    return train_members(
        members,
        member_fitter(trainer, train, val, loss),
        trainer.seed,
        fit_together=stacked_fitter(trainer, train, val, loss),
    )


def average_member_proba(members: list[nn.Module] | nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([m(x).softmax(1) for m in members]).mean(0)


def average_member_output(members: list[nn.Module] | nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """The members' mean raw output: a regression's standardized prediction (the mean of affine answers)."""
    return torch.stack([m(x) for m in members]).mean(0)


class Ensemble(Learner):
    """``learner.members`` backbones trained independently; the output is their mean probability (a
    regression: their mean prediction)."""

    name = "ens"
    config_model: ClassVar[type[LearnerConfig]] = EnsembleConfig
    model: nn.ModuleList

    def build(self, arch: dict[str, Any]) -> nn.Module:
        # gEns shares this class but not the key: it builds its members from arch.
        members = cast(EnsembleConfig, self.config).members
        return nn.ModuleList(self.new_members(range(members)))

    def new_members(self, indices: range) -> list[nn.Module]:
        """The backbones ``indices`` of the ensemble."""
        return independent_members(self, indices)

    def members_to_train(self) -> range:
        return range(len(self.model))

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        members = [(i, self.model[i]) for i in self.members_to_train()]
        return train_independent_members(members, trainer, train, val, self.training_loss)

    def forward_proba(self, x: torch.Tensor) -> torch.Tensor:
        return average_member_proba(self.model, x)

    def forward_prediction(self, x: torch.Tensor) -> torch.Tensor:
        return average_member_output(self.model, x)
