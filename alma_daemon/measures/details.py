"""What a classifier's measures show beside their value (:meth:`Measure.details`): for a binary task, the
error and the positive class's recall, precision and PR-AUC.

Both :mod:`~alma_daemon.measures.classification` and :mod:`~alma_daemon.measures.binary` show them, so
this module finds the measures by name in the registry (:func:`measure_class`, as
:func:`~alma_daemon.measures.base.stopping_measure` does) and imports neither.
"""

from __future__ import annotations

import torch

from alma_daemon.measures.base import Measure, measure_class

#: The measures a binary task's details show, in order, by name.
BINARY_DETAILS: tuple[str, ...] = ("error", "recall", "precision", "pr_auc")


def binary_details(measure: Measure, outputs: torch.Tensor, y: torch.Tensor, *, skip: str) -> dict[str, float]:
    """A binary task's measures beside ``skip`` (the headline): error, recall, precision, PR-AUC."""
    outputs, y = outputs.cpu(), y.cpu()
    return {
        name: measure_class(name)(measure.target).measure(outputs, y).value for name in BINARY_DETAILS if name != skip
    }
