"""gEns's growth (paper section 4.2) for members of any kind: freeze the members, add k new ones.

The image gEns (backbones) and the language gEns (Switch LMs) grow alike; they differ in the
ensemble they extend, which builds members (``new_members``) and trains the ones
:meth:`GrowsByMembers.members_to_train` names.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from alma_daemon.config import LearnerConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.training.loop import Trainer


def current_architecture(arch: dict[str, Any]) -> dict[str, Any]:
    """A saved ``arch`` in the current form.

    switch-lm-gens saved ``trained`` as the number of members trained (all of them: the newest part
    has trained), and before it kept ``frozen`` it grew one member at a time: all but the newest.
    """
    members, trained = arch["members"], arch["trained"]
    if not isinstance(trained, bool):
        trained = trained >= members
    return {"members": members, "frozen": arch.get("frozen", members - 1), "trained": trained}


class GrowsByMembers(GrowsOnceTrained):
    """Mixin placed before an ensemble class: growth freezes every member and adds ``learner.grow_members``.

    Training updates the members added at the last growth only; ``learner.max_members`` caps the count. ``arch``: ``{"members": count,
    "frozen": members kept fixed (the first ones), "trained": whether the members not frozen have
    trained since they were added}``. The ensemble class provides ``new_members(indices)``, each
    member drawn from its own seed, and trains :meth:`members_to_train`.
    """

    size_cap_key = "max_members"

    # Provided by the ensemble class (model: an nn.ModuleList) and the learner (config: with grow_members).
    model: Any
    config: Any
    device: Any
    new_members: Any

    def __init__(self, task: TaskInfo, config: LearnerConfig, seed: int, arch: dict[str, Any] | None = None):
        saved = None if arch is None else current_architecture(arch)
        super().__init__(task, config, seed, saved)  # type: ignore[call-arg]

    def initial_architecture(self) -> dict[str, Any]:
        return {"members": 1, "frozen": 0, "trained": False}

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return nn.ModuleList(self.new_members(range(arch["members"])))

    def members_to_train(self) -> range:
        return range(self.arch["frozen"], self.arch["members"])

    def mark_untrained(self) -> None:
        # Retraining from scratch re-draws every member, frozen ones included: all train again.
        self.arch = {**self.arch, "frozen": 0, "trained": False}

    def grown_size(self) -> int:
        return int(self.arch["members"])

    def growth_skipped(self) -> dict[str, Any]:
        return {"added": 0, "members": self.arch["members"]}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        """Freeze every member and add k freshly initialized ones (fewer where the cap leaves less room)."""
        count, room = self.arch["members"], self.room_to_grow()
        added = self.config.grow_members if room is None else min(self.config.grow_members, room)
        self.model.extend(m.to(self.device) for m in self.new_members(range(count, count + added)))
        self.arch = {"members": count + added, "frozen": count, "trained": False}
        return GrowthReport({"added": added, "members": count + added})
