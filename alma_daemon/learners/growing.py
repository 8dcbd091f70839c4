"""The rules every growing learner follows: grow only once the newest part has trained, and never past its cap.

The engine may ask for a growth step before any stage has trained (the first stage, or the first one
after a retraining from scratch). Growing then would shape new parts from a network no data has
shaped: gEns would freeze an untrained member, gMoE and Firefly would split by the losses of random
weights. So a growth step waits until the newest part has trained, and says so in its summary.

On an endless stream a learner that grows at every stage would grow without end; its size cap
(``learner.max_members``, ``max_experts`` or ``max_parameters``, in the unit it grows by) stops it:
a step grows no further than the cap, and once at the cap every step is skipped, saying so, and the
stages fine-tune. The cap is config, so every checkpoint's spec carries it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.training.loop import FitReport, Trainer

#: The reason a skipped growth step gives in the stage's record.
NOT_TRAINED_YET = "the newest part has not trained yet"
#: How the reason of a growth step skipped at the size cap begins.
AT_SIZE_CAP = "at its cap"


class GrowsOnceTrained:
    """Mixin placed before the learner's base class: :meth:`grow` waits for the newest part to train, and
    stops at the size cap.

    A learner implements :meth:`grow_trained` (the growth step, no larger than :meth:`room_to_grow`),
    :meth:`growth_skipped` (the summary of a step that grew nothing) and, to take a size cap,
    :attr:`size_cap_key` and :meth:`grown_size`. ``arch["trained"]``, a bool, records the state in the checkpoint's
    spec, so the rule survives a restart. The mixin's ``fit`` sets it and :meth:`reinitialize`
    (retraining from scratch) clears it; a learner whose ``arch`` says more about what trains
    (gEns's frozen members) overrides :meth:`mark_untrained`.
    """

    grows = True
    arch: dict[str, Any]
    config: Any
    #: The ``learner`` key of the size cap, in the unit the learner grows by (its value None: unbounded);
    #: None for a learner without a cap.
    size_cap_key: ClassVar[str | None] = None

    def grown_size(self) -> int:
        """The learner's size in its cap's unit (members, experts per layer, parameters)."""
        raise NotImplementedError

    def smallest_growth(self) -> int:
        """The least a growth step can add, in the cap's unit: one member or expert; Firefly overrides it."""
        return 1

    @property
    def size_cap(self) -> int | None:
        cap: int | None = None if self.size_cap_key is None else getattr(self.config, self.size_cap_key)
        return cap

    def room_to_grow(self) -> int | None:
        """How much the learner may still grow, in its cap's unit; None without a cap. A step grows at most this."""
        cap = self.size_cap
        return None if cap is None else max(0, cap - self.grown_size())

    @property
    def at_size_cap(self) -> bool:
        """Whether even the smallest growth would pass the cap: growth steps are skipped from now on."""
        room = self.room_to_grow()
        return room is not None and room < self.smallest_growth()

    def newest_part_trained(self) -> bool:
        return bool(self.arch["trained"])

    def mark_trained(self) -> None:
        self.arch = {**self.arch, "trained": True}

    def mark_untrained(self) -> None:
        self.arch = {**self.arch, "trained": False}

    def growth_skipped(self) -> dict[str, Any]:
        """The details of a growth step that grew nothing (keys as in :meth:`grow_trained`'s)."""
        return {}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        raise NotImplementedError

    def grow(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        if self.at_size_cap:
            reason = f"{AT_SIZE_CAP} (learner.{self.size_cap_key}: {self.size_cap})"
            return GrowthReport(self.growth_skipped(), skipped=reason)
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
