"""The scale the measure-driven policies (adaptive, forecast) run their rules on, for any task measure.

A policy compares the live model's measures on new chunks: a rise means the stream changed, a fall
that a stage paid off. Every task measure (alma_daemon/measures) maps onto one lower-is-better scale
for that: an error rate, a log-loss or a mean squared error as it is, a recall or a PR-AUC as its
shortfall from 1, a perplexity as its log. :class:`MeasureScale` holds that mapping, the variance of a
mean on it, and the words a reason uses; :class:`ChunkMeasures` pools one model's measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alma_daemon.measures import Measure


@dataclass(frozen=True)
class MeasureScale:
    """The policies' view of the task's measure ``name``: its loss scale, variance and wording."""

    name: str

    @property
    def measure(self) -> Measure:
        # Here, not at the top: the measures import torch, and reading a config imports the policies.
        from alma_daemon.measures import MEASURES, Target

        cls = MEASURES[self.name]
        # The scale needs no classes or costs: any target of a kind the measure fits will do.
        return cls(Target(kind=cls.kinds[0], num_classes=2))

    def value(self, measured: float) -> float:
        """A measure on the rules' scale (lower is better)."""
        return self.measure.loss(measured)

    def variance(self, mean: float, examples: int, unit_variance: float | None = None) -> float:
        """Variance of a mean on the rules' scale taken on ``examples`` counted examples (a rate's is
        binomial, floored; a mean loss's is its per-example ``unit_variance`` over ``examples``)."""
        unit = unit_variance if unit_variance is not None and math.isfinite(unit_variance) else mean**2
        return self.measure.variance(mean, examples, unit)

    def unit_variance(self, measured: float | None) -> float | None:
        """The per-example variance a measurement brings to pool: a mean loss's; None for a rate (binomial
        from its mean) or a perplexity (a fixed error), whose variance needs none."""
        if self.measure.rate or self.name == "perplexity":
            return None
        return measured

    def shown(self, value: float) -> str:
        """A value on the rules' scale as the measure reads: "error 0.031", "recall 0.700", "perplexity 95.20"."""
        m = self.measure
        measured = math.exp(value) if self.name == "perplexity" else (1 - value if m.higher_is_better else value)
        return m.shown(measured)

    def worse_by(self, delta: float) -> str:
        """A rise of ``delta`` (> 0) on the rules' scale as a person reads it: "0.12 above" (an error),
        "0.12 below" (a recall), "10.5 % above" (a perplexity)."""
        if self.name == "perplexity":
            return f"{100 * math.expm1(delta):.1f} % above"
        return f"{delta:.3g} {'below' if self.measure.higher_is_better else 'above'}"

    def gained(self, delta: float) -> str:
        """A stage's gain ``delta`` on the rules' scale (negative: a loss), as the reasons give it."""
        if self.name == "perplexity":
            return (
                f"{-100 * math.expm1(-delta):.1f} % of the perplexity"
                if delta >= 0
                else f"-{100 * math.expm1(-delta):.1f} %"
            )
        return f"{delta:.3g}" if delta >= 0 else f"-{-delta:.3g}"


class ChunkMeasures:
    """One model's measures on the chunks it met before training on them, on the rules' scale: their
    example-weighted mean, and their pooled per-example variance (for measures that are not rates)."""

    def __init__(self, data: dict[str, Any] | None = None):
        data = data or {}
        self.total = float(data.get("total", 0.0))
        self.examples = int(data.get("examples", 0))
        self.chunks = int(data.get("chunks", 0))
        self.variance_total = float(data.get("variance_total", 0.0))

    def add(self, value: float, examples: int, unit_variance: float | None = None) -> None:
        examples = max(1, examples)
        self.total += value * examples
        self.examples += examples
        self.chunks += 1
        if unit_variance is not None and math.isfinite(unit_variance):
            self.variance_total += unit_variance * examples

    @property
    def mean(self) -> float:
        return self.total / self.examples

    @property
    def unit_variance(self) -> float | None:
        """The pooled per-example variance; None where none was measured (rates, perplexities)."""
        return self.variance_total / self.examples if self.variance_total else None

    def variance(self, scale: MeasureScale) -> float:
        """The variance of :attr:`mean` on ``scale``."""
        return scale.variance(self.mean, self.examples, self.unit_variance)

    def to_dict(self) -> dict[str, Any]:
        data = {"total": self.total, "examples": self.examples, "chunks": self.chunks}
        # Written only where measured, so an error-rate policy's state reads as before.
        return {**data, "variance_total": self.variance_total} if self.variance_total else data
