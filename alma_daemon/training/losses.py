"""What a task's networks train on, and what their early stopping reads: one :class:`TaskLoss` per task kind.

Every learner but the language models hands the training loop (:class:`~alma_daemon.training.loop.Trainer`,
:mod:`~alma_daemon.training.members`) and its growth steps (gMoE's expert losses, Firefly's candidate
scores) the loss of its task (:func:`task_loss`), on the network's raw outputs:

- **classification**: cross-entropy of the logits, each example weighted by its class's
  ``task.class_weights`` (the weighted mean, as ``F.cross_entropy(weight=)`` takes it). Early stopping
  reads the task's measure on the validation set (recall and precision, which a model that flags
  everything or almost nothing maximizes, read the balanced error instead), on its lower-is-better scale, each example weighted
  by its class's weight where the measure is a mean over examples (error, log-loss, cost; recall's
  mean runs over the positives alone, so one class's weight changes nothing). An unweighted task
  judged by the error rate (the paper's) keeps the loop's own validation error, bit for bit.
- **regression**: the network has one output, a prediction of the *standardized* target
  ``(y - task.target_mean) / task.target_std`` (statistics of the stream's first chunk, saved in the
  task): an MLP initialized for unit-scale outputs then fits a target like Friedman's (mean 14, std 5)
  from its first epoch, and the loss's scale does not depend on the target's units. It trains on the
  squared error (``task.measure: mse``) or the absolute error (``mae``: the median minimizes it) and
  early-stops on the task's measure of the predictions in the target's units.

A measure the validation set leaves undefined (recall on a validation set without positives) counts as
no improvement, so early stopping neither keeps nor wipes a best epoch on it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.measures import Measure, stopping_measure, task_measure
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.loop import EVAL_BATCH, Trainer
from alma_daemon.training.validated import Validated, mean_with_error


def network_outputs(net: nn.Module, x: torch.Tensor, meter: FlopMeter | None = None) -> torch.Tensor:
    """``net``'s raw outputs on ``x``, in evaluation batches, on ``x``'s device (validation passes
    count as training compute, as in :meth:`Trainer.validation_error`)."""
    net.eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(x), EVAL_BATCH):
            xb = x[i : i + EVAL_BATCH]
            out.append(meter.run(("val", tuple(xb.shape)), lambda: net(xb)) if meter else net(xb))
    return torch.cat(out) if out else torch.empty(0, device=x.device)


class TaskLoss(ABC):
    """A task's training loss on a network's raw outputs (logits, or a regression's one output) and the
    lower-is-better validation value its early stopping reads."""

    def __init__(self, task: TaskInfo):
        self.task = task
        #: What early stopping reads: the task's measure, or for recall and precision the balanced error
        #: (:func:`~alma_daemon.measures.stopping_measure`).
        #: (a binary task's decision left out: the network's own outputs are weighted, not calibrated, and
        #: the decision is chosen after the stage on them).
        self.measure: Measure = stopping_measure(task_measure(replace(task, threshold=None, calibration=None)))

    @abstractmethod
    def per_example(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each example's (weighted) training loss: ``raw`` (..., N, outputs), ``y`` (..., N) -> (..., N)."""

    @abstractmethod
    def mean_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch: ``raw`` (N, outputs), ``y`` (N) -> a scalar."""

    @abstractmethod
    def stacked_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Stacked members' batches, ``raw`` (M, N, outputs), ``y`` (M, N): the sum of each member's
        :meth:`mean_loss`, so every member gets the gradient it would get alone."""

    @abstractmethod
    def answers(self, raw: torch.Tensor) -> torch.Tensor:
        """What the measure reads of raw outputs: class probabilities (N x C), or predictions (N) in the
        target's units."""

    def objective(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loop's objective: the batch's :meth:`mean_loss`."""
        return self.mean_loss(net(x), y)

    def validation_value(self, raw: torch.Tensor, y: torch.Tensor) -> float:
        """The task's measure of raw outputs on the validation set, on its lower-is-better scale (NaN
        without examples; +inf where the measure is undefined on them); a measure that is a mean over
        examples comes with its standard error (a :class:`~alma_daemon.training.validated.Validated`)."""
        if len(y) == 0:
            return math.nan
        outputs = self.answers(raw.float())
        terms = self.measure.per_example(outputs, y)
        mean = None if terms is None else mean_with_error(terms[0], self.example_weights(y) * terms[1])
        # Weighted by class, the measure is that mean; else the measure's own value, as it always was.
        value = float(mean) if mean is not None and self.weighs_classes else None
        if value is None:
            value = self.measure.loss(self.measure.measure(outputs, y).value)
        if math.isnan(value):
            return math.inf
        return value if mean is None else Validated(value, mean.standard_error)

    def example_weights(self, y: torch.Tensor) -> torch.Tensor:
        """Each validation example's weight in the measure's mean (float64, on the CPU): 1 but where the
        task weights its classes."""
        return torch.ones(len(y), dtype=torch.float64)

    @property
    def weighs_classes(self) -> bool:
        """Whether the measure's mean weighs each example by its class (``task.class_weights``)."""
        return False

    def validate(self, net: nn.Module, val: LabeledData, meter: FlopMeter | None = None) -> float:
        """Early stopping's value of ``net`` on ``val`` (:data:`~alma_daemon.training.loop.Validate`)."""
        return self.validation_value(network_outputs(net, val.x, meter), val.y)

    @property
    def counts_errors(self) -> bool:
        """Whether :meth:`validate` is the loop's own error count (the paper's path, kept bit for bit)."""
        return False


class ClassificationLoss(TaskLoss):
    """Cross-entropy of the logits, weighted by ``task.class_weights``; early stopping on the task's measure."""

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.weight = torch.tensor(task.class_weights, dtype=torch.float32) if task.class_weights else None

    def weight_on(self, device: torch.device) -> torch.Tensor | None:
        if self.weight is not None and self.weight.device != device:
            self.weight = self.weight.to(device)
        return self.weight

    def per_example(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = F.cross_entropy(raw.flatten(0, -2), y.flatten(), weight=self.weight_on(raw.device), reduction="none")
        return losses.view(y.shape)

    def mean_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Unweighted, exactly the call the loop always made (the paper's series stay bit for bit).
        return F.cross_entropy(raw, y, weight=self.weight_on(raw.device))

    def stacked_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = self.per_example(raw, y)
        weight = self.weight_on(raw.device)
        if weight is None:
            return losses.mean(1).sum()
        return (losses.sum(1) / weight[y].sum(1)).sum()

    def answers(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.softmax(-1)

    def example_weights(self, y: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return super().example_weights(y)
        return self.weight.cpu().double()[y.cpu().long()]

    @property
    def weighs_classes(self) -> bool:
        return self.weight is not None

    @property
    def counts_errors(self) -> bool:
        return self.measure.name == "error" and self.weight is None

    def validate(self, net: nn.Module, val: LabeledData, meter: FlopMeter | None = None) -> float:
        if self.counts_errors:
            return Trainer.validation_error(net, val, meter)
        return super().validate(net, val, meter)


#: A regression's per-example training loss by ``task.measure``: the error it is judged by.
REGRESSION_TERMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mse": torch.square,
    "mae": torch.abs,
}


class RegressionLoss(TaskLoss):
    """The squared (mse) or absolute (mae) error of one output against the standardized target."""

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.term = REGRESSION_TERMS[self.measure.name]
        self.mean = task.target_mean if task.target_mean is not None else 0.0
        self.std = task.target_std if task.target_std is not None else 1.0

    def standardized(self, y: torch.Tensor) -> torch.Tensor:
        return (y.float() - self.mean) / self.std

    def per_example(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.term(raw[..., 0] - self.standardized(y))

    def mean_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.per_example(raw, y).mean()

    def stacked_loss(self, raw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.per_example(raw, y).mean(1).sum()

    def answers(self, raw: torch.Tensor) -> torch.Tensor:
        return self.destandardized(raw[..., 0])

    def destandardized(self, z: torch.Tensor) -> torch.Tensor:
        """Standardized predictions in the target's units."""
        return z * self.std + self.mean


#: The loss of each task kind a backbone learner takes (language models train on their own).
TASK_LOSSES: dict[str, type[TaskLoss]] = {
    "classification": ClassificationLoss,
    "regression": RegressionLoss,
}


def task_loss(task: TaskInfo) -> TaskLoss:
    """The loss ``task``'s networks train and early-stop on."""
    if task.kind not in TASK_LOSSES:
        raise ValueError(f"no training loss for a {task.kind} task; known: {', '.join(TASK_LOSSES)}")
    return TASK_LOSSES[task.kind](task)
