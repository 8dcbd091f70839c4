"""A language model's measure: perplexity, which its learner computes itself (token by token)."""

from __future__ import annotations

import math

import torch

from alma_daemon.config.measure_traits import PERPLEXITY
from alma_daemon.measures.base import Measure, Measurement

#: Standard error of a log-perplexity measured on one chunk: a chunk's tokens are not independent
#: draws, so no count of them gives it; 1 % of the perplexity (docs/policies.md).
LOG_PERPLEXITY_ERROR = 0.01


class Perplexity(Measure):
    """exp of the mean next-token negative log-likelihood. Policies compare its log (a rise of 0.1 is
    about 10 %)."""

    name = "perplexity"
    traits = PERPLEXITY
    description = "language models: exp of the mean next-token negative log-likelihood"

    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        raise TypeError("a language model measures its perplexity itself (Learner.measure_on)")

    def baseline(self, y: torch.Tensor) -> float:
        return math.nan

    def loss(self, value: float) -> float:
        return math.log(value)

    def variance(self, mean_loss: float, examples: int, unit_variance: float) -> float:
        return LOG_PERPLEXITY_ERROR**2

    def shown(self, value: float) -> str:
        return f"perplexity {value:.2f}"
