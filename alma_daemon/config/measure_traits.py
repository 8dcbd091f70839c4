"""Each task measure's declaration: what ``alma status``, the records and the reports need to know of it
without importing the measures themselves (they import torch, and ``alma status`` answers at once).

The entry points of group ``alma_daemon.measures`` (pyproject.toml) name these declarations; each names its
measure class in ``implementation``, and the class names it back as its ``traits``.
"""

from __future__ import annotations

from dataclasses import dataclass

from alma_daemon.registry import MEASURES

#: The classifiers' task kinds, which most measures of a class take.
CLASSIFIERS = ("binary", "multiclass")


@dataclass(frozen=True)
class MeasureTraits:
    """A measure's class (``module:attr``), its direction, whether it is a rate (a mean of terms in [0, 1],
    shown to 4 decimals), and the task kinds it is defined for."""

    implementation: str
    higher_is_better: bool = False
    rate: bool = False
    kinds: tuple[str, ...] = CLASSIFIERS


ERROR = MeasureTraits("alma_daemon.measures.classification:ErrorRate", rate=True)
LOG_LOSS = MeasureTraits("alma_daemon.measures.classification:LogLoss")
BALANCED_ERROR = MeasureTraits("alma_daemon.measures.classification:BalancedError", rate=True)
RECALL = MeasureTraits("alma_daemon.measures.binary:Recall", higher_is_better=True, rate=True, kinds=("binary",))
PRECISION = MeasureTraits("alma_daemon.measures.binary:Precision", higher_is_better=True, rate=True, kinds=("binary",))
PR_AUC = MeasureTraits("alma_daemon.measures.binary:PrAuc", higher_is_better=True, rate=True, kinds=("binary",))
COST = MeasureTraits("alma_daemon.measures.binary:Cost", kinds=("binary",))
PERPLEXITY = MeasureTraits("alma_daemon.measures.language:Perplexity", kinds=("language_model",))
MSE = MeasureTraits("alma_daemon.measures.regression:MeanSquaredError", kinds=("regression",))
MAE = MeasureTraits("alma_daemon.measures.regression:MeanAbsoluteError", kinds=("regression",))


def measure_traits() -> dict[str, MeasureTraits]:
    """Every task measure's traits (``task.measure``) by name."""
    return MEASURES.declarations()


def measure_misfit(name: str, kind: str) -> str | None:
    """Why measure ``name`` cannot judge a ``kind`` task (binary, multiclass, regression,
    language_model), in the words start-up and ``alma config check`` refuse it with; None: it can."""
    traits = measure_traits()
    if kind in traits[name].kinds:
        return None
    fits = sorted(other for other, each in traits.items() if kind in each.kinds)
    return f"measure {name!r} does not fit a {kind} task; it takes {', '.join(fits)}"
