"""A validation measure with its standard error: what lets a stage tell a better epoch from a luckier draw.

Early stopping's ``train.keep_epoch: last_unless_beaten`` (training/loop.py) keeps a stage's last epoch unless
an earlier one validated better by more than the last one's standard error. A measure that is a mean over
examples (the error rate, a log-loss, a cost, a squared error) has one; it travels with the measure as a
:class:`Validated`, a float, so every caller that compares measures reads it as before.
"""

from __future__ import annotations

import math

import torch


class Validated(float):
    """A validation measure (lower is better) with its standard error over the validation examples.

    A float, so every comparison reads the measure; ``EarlyStopping.restore`` (training/loop.py) also reads
    ``standard_error`` to tell an epoch that validated better from one that drew luckier examples.
    """

    standard_error: float

    def __new__(cls, value: float, standard_error: float) -> Validated:
        validated = super().__new__(cls, value)
        validated.standard_error = standard_error
        return validated

    def __getnewargs__(self) -> tuple[float, float]:  # type: ignore[override]  # pickle and copy rebuild both
        return float(self), self.standard_error


def mean_with_error(losses: torch.Tensor, weights: torch.Tensor) -> Validated:
    """The weighted mean of per-example ``losses`` and its standard error (weights of 0 leave an example
    out; NaN without weight): ``sqrt(sum w^2 (l - mean)^2) / sum w``, the textbook one for equal weights."""
    losses, weights = losses.double(), weights.double()
    total = float(weights.sum())
    if total <= 0:
        return Validated(math.nan, math.nan)
    mean = float((losses * weights).sum()) / total
    spread = float((weights.square() * (losses - mean).square()).sum()) ** 0.5
    return Validated(mean, spread / total)


def binomial(wrong: int, examples: int) -> float:
    """The error rate of ``wrong`` mistakes in ``examples`` with its standard error (NaN without examples)."""
    if not examples:
        return math.nan
    rate = wrong / examples
    return Validated(rate, math.sqrt(rate * (1 - rate) / examples))
