"""What ``alma status``, the records and the reports need to know of each task measure, without
importing the measures themselves (they import torch, and ``alma status`` answers at once).

The measure classes (:mod:`alma_daemon.measures`) declare the same traits; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasureTraits:
    """A measure's direction and whether it is a rate (a mean of terms in [0, 1], shown to 4 decimals)."""

    higher_is_better: bool = False
    rate: bool = False


#: Every task measure (``task.measure``) by name, in the order :data:`alma_daemon.measures.MEASURES`
#: registers them (the order of the records' cumulative columns).
MEASURE_TRAITS: dict[str, MeasureTraits] = {
    "error": MeasureTraits(rate=True),
    "log_loss": MeasureTraits(),
    "balanced_error": MeasureTraits(rate=True),
    "recall": MeasureTraits(higher_is_better=True, rate=True),
    "precision": MeasureTraits(higher_is_better=True, rate=True),
    "pr_auc": MeasureTraits(higher_is_better=True, rate=True),
    "cost": MeasureTraits(),
    "perplexity": MeasureTraits(),
    "mse": MeasureTraits(),
    "mae": MeasureTraits(),
}
