"""A binary classifier's measures of its positive class (``task.positive_class``): recall, precision,
PR-AUC, and the error weighted by what each kind of mistake costs.

Predictions are the task's decision (``Target.decide``): the most probable class, or the positive class
where its probability reaches the task's threshold (``task.decision``), as served answers are."""

from __future__ import annotations

import math

import torch

from alma_daemon.config.measure_traits import COST, PR_AUC, PRECISION, RECALL
from alma_daemon.measures.base import Measure, Measurement, mean_measurement, on_cpu, proportion
from alma_daemon.measures.classification import BalancedError
from alma_daemon.measures.details import binary_details


class PositiveClassMeasure(Measure):
    """A measure of a binary task's positive class."""

    def flagged(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.target.decide(outputs) == self.target.positive

    def positives(self, y: torch.Tensor) -> torch.Tensor:
        return y == self.target.positive

    def details(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return binary_details(self, outputs, y, skip=self.name)


class Recall(PositiveClassMeasure):
    """The share of positives the model flags (fraud caught among all fraud)."""

    name = "recall"
    traits = RECALL
    # Flagging everything (recall) or only the surest case (precision) maximizes it: a stage stops
    # early on the balanced error instead, which neither trick improves.
    stopping_measure = BalancedError.name
    description = "binary: share of the positive class's examples predicted positive"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        positives = self.positives(y)
        return proportion(int((self.flagged(outputs) & positives).sum()), int(positives.sum()))

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positives = self.positives(y.cpu())
        return (~self.flagged(outputs.cpu()) & positives).double(), positives


class Precision(PositiveClassMeasure):
    """The share of flagged examples that are positive (fraud among the alerts)."""

    name = "precision"
    traits = PRECISION
    # Flagging everything (recall) or only the surest case (precision) maximizes it: a stage stops
    # early on the balanced error instead, which neither trick improves.
    stopping_measure = BalancedError.name
    description = "binary: share of the examples predicted positive that are positive"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        flagged = self.flagged(outputs)
        if len(y) and not flagged.any():
            # A model that flags nothing has no true alert to show: 0, as scikit-learn's default has it,
            # so that a version that stops flagging reads as the worst, not as unmeasured.
            return Measurement(0.0, 0, 0.0)
        return proportion(int((flagged & self.positives(y)).sum()), int(flagged.sum()))

    def on_resamples(self, outputs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outputs, y = outputs.detach().cpu(), y.cpu()
        flagged = self.flagged(outputs)
        # Counts are whole numbers in float64: their sums are exact, the ratios those of measure().
        alerts = counts @ flagged.double()
        true_alerts = counts @ (flagged & self.positives(y)).double()
        return torch.where(alerts > 0, true_alerts / alerts, 0.0)


def average_precision(scores: torch.Tensor, positives: torch.Tensor) -> float:
    """The area under the precision-recall curve as average precision: over the thresholds from the highest
    score down, the precision at each one weighted by the recall it adds (examples of equal score share a
    threshold, so an input-blind model scores the positives' share). NaN without a positive."""
    n_pos = int(positives.sum())
    if n_pos == 0:
        return math.nan
    order = torch.argsort(scores.double(), descending=True, stable=True)
    ranked, hits = scores.double()[order], positives[order].double()
    _, group_sizes = torch.unique_consecutive(ranked, return_counts=True)
    ends = group_sizes.cumsum(0) - 1
    true_positives = hits.cumsum(0)[ends]
    precision = true_positives / (ends + 1).double()
    added_recall = torch.diff(true_positives, prepend=torch.zeros(1, dtype=torch.float64)) / n_pos
    return float((precision * added_recall).sum())


def average_precision_on_resamples(scores: torch.Tensor, positives: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """:func:`average_precision` of each resample of the examples (``counts[b, i]``: how many times example
    ``i`` is drawn in resample ``b``), from one sort of the scores. A resample's thresholds are the groups
    of equal score it draws from, and only a group holding positives adds recall; so each term needs, at
    each group holding positives, the examples drawn down to it and the positives drawn in it and above,
    sums of counts over a few segments of the ranking. NaN for a resample without a positive."""
    order = torch.argsort(scores.double(), descending=True, stable=True)
    _, group_sizes = torch.unique_consecutive(scores.double()[order], return_counts=True)
    group = torch.empty(len(order), dtype=torch.long)
    group[order] = torch.repeat_interleave(torch.arange(len(group_sizes)), group_sizes)
    scoring = torch.unique(group[positives.bool()])  # the groups holding positives, ranked
    # Segment k: the examples ranked below group scoring[k - 1] down to group scoring[k] (k = K: the rest).
    segment = torch.searchsorted(scoring, group)
    drawn = counts.new_zeros(len(counts), len(scoring) + 1).scatter_add_(1, segment.expand_as(counts), counts)
    flagged = drawn[:, :-1].cumsum(1)
    hits = positives.bool()
    added = counts.new_zeros(len(counts), len(scoring)).scatter_add_(
        1, segment[hits].expand(len(counts), -1), counts[:, hits]
    )
    true_positives = added.cumsum(1)
    n_pos = true_positives[:, -1:] if len(scoring) else counts.new_zeros(len(counts), 1)
    # The terms of average_precision, in the same operations; a group the resample does not draw adds none.
    terms = torch.where(added > 0, true_positives / flagged * (added / n_pos), 0.0)
    return torch.where(n_pos.squeeze(1) > 0, terms.sum(1), math.nan)


class PrAuc(PositiveClassMeasure):
    """The area under the precision-recall curve of the positive class's probability (average precision):
    how well the model ranks positives first, at every threshold."""

    name = "pr_auc"
    traits = PR_AUC
    description = (
        "binary: area under the precision-recall curve (average precision) of the positive class's probability"
    )

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        positives = self.positives(y)
        value = average_precision(outputs[:, self.target.positive], positives)
        # Its uncertainty comes from the few positives, as a recall's does.
        n = int(positives.sum())
        return Measurement(value, n, value * (1 - value) if n else math.nan)

    def on_resamples(self, outputs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outputs, y = outputs.detach().cpu(), y.cpu()
        return average_precision_on_resamples(outputs[:, self.target.positive], self.positives(y), counts)

    def constant_outputs(self, y: torch.Tensor) -> torch.Tensor:
        # Every example equally likely positive: the curve's area is the positives' share.
        return torch.full((len(y), self.target.num_classes), 1.0 / self.target.num_classes, dtype=torch.float64)


class Cost(PositiveClassMeasure):
    """The mean cost of the mistakes: ``task.false_negative_cost`` per positive missed,
    ``task.false_positive_cost`` per false alarm, over all examples."""

    name = "cost"
    traits = COST
    description = "binary: mean cost per example, task.false_negative_cost per positive missed and task.false_positive_cost per false alarm"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        losses, _ = self.per_example(outputs, y)
        return mean_measurement(losses, rate=False)

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flagged, positives = self.flagged(outputs.cpu()), self.positives(y.cpu())
        losses = (positives & ~flagged).double() * self.target.false_negative_cost + (
            ~positives & flagged
        ).double() * self.target.false_positive_cost
        return losses, torch.ones_like(losses, dtype=torch.bool)
