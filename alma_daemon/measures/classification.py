"""A classifier's measures on any number of classes: error rate, log-loss and balanced error."""

from __future__ import annotations

import math

import torch

from alma_daemon.config.measure_traits import BALANCED_ERROR, ERROR, LOG_LOSS
from alma_daemon.measures.base import Measure, Measurement, Target, mean_measurement, on_cpu
from alma_daemon.measures.details import binary_details

#: Probabilities are clipped to this before their log: a confident mistake costs a large, finite loss.
LOG_LOSS_FLOOR = 1e-12


class ErrorRate(Measure):
    """The share of wrong predictions: the paper's measure, the CER's terms."""

    name = "error"
    traits = ERROR
    description = "share of wrong predictions (the paper's; its sum over chunks is the CER)"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        n = len(y)
        if n == 0:
            return Measurement(math.nan, 0, math.nan)
        p = int((self.target.decide(outputs) != y).sum()) / n
        return Measurement(p, n, p * (1 - p))

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wrong = (self.target.decide(outputs.cpu()) != y.cpu()).double()
        return wrong, torch.ones_like(wrong, dtype=torch.bool)

    def shown(self, value: float) -> str:
        return f"error {value:.3f}"

    def details(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        if self.target.kind == "binary":
            return binary_details(self, outputs, y, skip=self.name)
        return {}


class LogLoss(Measure):
    """The mean negative log-probability of the true class: rewards calibrated probabilities."""

    name = "log_loss"
    traits = LOG_LOSS
    description = "mean negative log-probability of the true class"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        losses, _ = self.per_example(outputs, y)
        return mean_measurement(losses, rate=False)

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = outputs.cpu().double().gather(1, y.cpu().long().view(-1, 1)).squeeze(1)
        losses = -p.clamp_min(LOG_LOSS_FLOOR).log()
        return losses, torch.ones_like(losses, dtype=torch.bool)

    def details(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return class_details(self, outputs, y)


def per_class_recall(outputs: torch.Tensor, y: torch.Tensor, target: Target) -> list[float]:
    """Each class's recall under the task's decision (NaN for a class with no example)."""
    predicted = target.decide(outputs)
    recalls = []
    for c in range(target.num_classes):
        of_class = y == c
        n = int(of_class.sum())
        recalls.append(int((predicted[of_class] == c).sum()) / n if n else math.nan)
    return recalls


class BalancedError(Measure):
    """One minus the mean of the classes' recalls: every class counts alike, however rare."""

    name = "balanced_error"
    traits = BALANCED_ERROR
    description = "1 - the mean of the classes' recalls (every class counts alike, however rare)"

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        recalls = [r for r in per_class_recall(outputs, y, self.target) if not math.isnan(r)]
        if not recalls:
            return Measurement(math.nan, 0, math.nan)
        value = 1.0 - sum(recalls) / len(recalls)
        # The rarest present class bounds how well the mean is known.
        counts = torch.bincount(y.long(), minlength=self.target.num_classes)
        rarest = int(counts[counts > 0].min())
        return Measurement(value, rarest * len(recalls), value * (1 - value))

    def on_resamples(self, outputs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outputs, y = outputs.detach().cpu(), y.cpu()
        classes = torch.nn.functional.one_hot(y.long(), self.target.num_classes).double()
        right = (self.target.decide(outputs) == y).double().unsqueeze(1)
        # Counts are whole numbers in float64: the sums are exact, each recall the ratio measure() takes.
        drawn, found = counts @ classes, counts @ (classes * right)
        total = counts.new_zeros(len(counts))
        present = counts.new_zeros(len(counts))
        for c in range(self.target.num_classes):
            # The recalls summed in class order, as measure() sums them: the same value to the last bit.
            has = drawn[:, c] > 0
            total = total + torch.where(has, found[:, c] / drawn[:, c], 0.0)
            present = present + has.double()
        return 1.0 - total / present

    def details(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return class_details(self, outputs, y)


def class_details(measure: Measure, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The error and each class's recall (binary: recall, precision and PR-AUC of the positive class)."""
    if measure.target.kind == "binary":
        return binary_details(measure, outputs, y, skip=measure.name)
    outputs, y = outputs.cpu(), y.cpu()
    details = {"error": ErrorRate(measure.target).measure(outputs, y).value} if measure.name != "error" else {}
    for c, recall in enumerate(per_class_recall(outputs, y, measure.target)):
        details[f"recall[{measure.target.class_name(c)}]"] = recall
    return details
