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

from dataclasses import replace

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.configs import GrowingEnsembleConfig
from alma_daemon.learners.ens import Ensemble
from alma_daemon.learners.growing_ensemble import GrowsByMembers
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.training.loop import Trainer


class GrowingEnsemble(GrowsByMembers, Ensemble):
    """Ens's members, trained as in Ens (stacked where they allow it); growth freezes them and adds k new ones.

    ``arch``: see :class:`~alma_daemon.learners.growing_ensemble.GrowsByMembers`.
    """

    name = "gens"
    config_model = GrowingEnsembleConfig
    config: GrowingEnsembleConfig

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        # Image gEns's growth records also count the frozen members (switch-lm-gens's never did): saved
        # series keep their keys.
        report = super().grow_trained(val, trainer)
        return replace(report, details={**report.details, "frozen": self.arch["frozen"]})
