"""The rule every growing learner follows: grow only once the newest part has trained.

The engine may ask for a growth step before any stage has trained (the first stage, or the first one
after a retraining from scratch). Growing then would shape new parts from a network no data has
shaped: gEns would freeze an untrained member, gMoE and Firefly would split by the losses of random
weights. So a growth step waits until the newest part has trained, and says so in its summary.
"""

from __future__ import annotations

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.training.loop import FitReport, Trainer

#: The reason a skipped growth step gives in the stage's record.
NOT_TRAINED_YET = "the newest part has not trained yet"


class GrowsOnceTrained:
    """Mixin placed before the learner's base class: :meth:`grow` waits for the newest part to train.

    A learner implements :meth:`grow_trained` (the growth step) and :meth:`growth_skipped` (the summary
    of a step that grew nothing). ``arch["trained"]``, a bool, records the state in the checkpoint's
    spec, so the rule survives a restart. The mixin's ``fit`` sets it and :meth:`reinitialize`
    (retraining from scratch) clears it; a learner whose ``arch`` says more about what trains
    (gEns's frozen members) overrides :meth:`mark_untrained`.
    """

    grows = True
    arch: dict

    def newest_part_trained(self) -> bool:
        return bool(self.arch["trained"])

    def mark_trained(self) -> None:
        self.arch = {**self.arch, "trained": True}

    def mark_untrained(self) -> None:
        self.arch = {**self.arch, "trained": False}

    def growth_skipped(self) -> dict:
        """The details of a growth step that grew nothing (keys as in :meth:`grow_trained`'s)."""
        return {}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        raise NotImplementedError

    def grow(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        if not self.newest_part_trained():
            return GrowthReport(self.growth_skipped(), skipped=NOT_TRAINED_YET)
        return self.grow_trained(val, trainer)

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        report: FitReport = super().fit(train, val, trainer)  # type: ignore[misc]
        self.mark_trained()
        return report

    def reinitialize(self, seed: int) -> None:
        self.mark_untrained()
        super().reinitialize(seed)  # type: ignore[misc]
