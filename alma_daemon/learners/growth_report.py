"""What one growth step did: :class:`GrowthReport`, as a stage's record and the results rows show it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GrowthReport:
    """One growth step: the learner's own summary, the compute it spent, and why it grew nothing.

    ``details`` is the learner's summary of what grew (members added, experts split, units
    inserted), JSON-able. ``flops`` is the compute spent choosing how to grow (validation losses,
    candidate scoring), charged to the stage's training FLOPs; None when choosing cost nothing.
    ``skipped`` says why the step grew nothing (None when it ran): the stage is then a fine-tune.
    """

    details: dict[str, Any] = field(default_factory=dict)
    flops: int | None = None
    skipped: str | None = None

    @property
    def grew(self) -> bool:
        return self.skipped is None

    def as_row(self) -> dict[str, Any]:
        """The report as the ``growth`` entry of a row: the details, then ``flops``, then ``reason``."""
        row = dict(self.details)
        if self.flops is not None:
            row["flops"] = self.flops
        if self.skipped is not None:
            row["reason"] = self.skipped
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> GrowthReport:
        details = {k: v for k, v in row.items() if k not in ("flops", "reason")}
        return cls(details, row.get("flops"), row.get("reason"))
