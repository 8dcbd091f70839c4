"""What ``alma status``, the records and the reports need to know of each task measure, without
importing the measures themselves (they import torch, and ``alma status`` answers at once).

The measure classes (:mod:`alma_daemon.measures`) declare the same traits; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The classifiers' task kinds, which most measures of a class take.
CLASSIFIERS = ("binary", "multiclass")


@dataclass(frozen=True)
class MeasureTraits:
    """A measure's direction, whether it is a rate (a mean of terms in [0, 1], shown to 4 decimals), and
    the task kinds it is defined for."""

    higher_is_better: bool = False
    rate: bool = False
    kinds: tuple[str, ...] = CLASSIFIERS


#: Every task measure (``task.measure``) by name, in the order :data:`alma_daemon.measures.MEASURES`
#: registers them (the order of the records' cumulative columns).
MEASURE_TRAITS: dict[str, MeasureTraits] = {
    "error": MeasureTraits(rate=True),
    "log_loss": MeasureTraits(),
    "balanced_error": MeasureTraits(rate=True),
    "recall": MeasureTraits(higher_is_better=True, rate=True, kinds=("binary",)),
    "precision": MeasureTraits(higher_is_better=True, rate=True, kinds=("binary",)),
    "pr_auc": MeasureTraits(higher_is_better=True, rate=True, kinds=("binary",)),
    "cost": MeasureTraits(kinds=("binary",)),
    "perplexity": MeasureTraits(kinds=("language_model",)),
    "mse": MeasureTraits(kinds=("regression",)),
    "mae": MeasureTraits(kinds=("regression",)),
}


def measure_misfit(name: str, kind: str) -> str | None:
    """Why measure ``name`` cannot judge a ``kind`` task (binary, multiclass, regression,
    language_model), in the words start-up and ``alma config check`` refuse it with; None: it can."""
    if kind in MEASURE_TRAITS[name].kinds:
        return None
    fits = sorted(other for other, traits in MEASURE_TRAITS.items() if kind in traits.kinds)
    return f"measure {name!r} does not fit a {kind} task; it takes {', '.join(fits)}"
