"""The task's measure: what the engine, the policies, the promotion guard and the reports judge a model by.

A :class:`Measure` turns a model's outputs on labeled examples (class probabilities, N x C, for a
classifier; predictions, N, for a regression) into a :class:`Measurement`: the value in the
measure's own units, and what its standard error rests on. Everything that compares models reads the
measure through these public views, so no caller branches on its name:

- :meth:`Measure.loss`: the value on a lower-is-better scale (recall 0.7 is a loss of 0.3), the scale
  policies rise and fall on and the guard's margin is in;
- :meth:`Measure.variance`: the variance of a mean loss taken on ``examples`` counted examples;
- :meth:`Measure.per_example`: each example's loss and whether it counts (a miss on a positive for
  recall, a weighted mistake for cost), for the guard's paired test; None for a measure that is not
  a mean over examples (precision, PR-AUC, balanced error), which the guard tests by resampling;
- :meth:`Measure.on_resamples`: the measure on a batch of resamples at once, for that resampling.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

from alma_daemon.config.measure_traits import MeasureTraits, measure_misfit
from alma_daemon.registry import MEASURES as MEASURE_REGISTRY
from alma_daemon.registry import Registry

#: The kinds of task a measure may be configured for.
TASK_KINDS = ("binary", "multiclass", "regression", "language_model")


@dataclass(frozen=True)
class Target:
    """What the measures need to know of a task's target: its kind, its classes and what a mistake costs."""

    #: One of :data:`TASK_KINDS`.
    kind: str
    num_classes: int = 0
    #: The names of the classes, in class-index order (empty: their indexes).
    classes: tuple[str, ...] = ()
    #: Binary tasks: the index of the positive class (the one recall, precision and PR-AUC are of).
    positive: int = 1
    false_negative_cost: float = 1.0
    false_positive_cost: float = 1.0
    #: Binary tasks: the positive class's probability from which an example is predicted positive (the
    #: task's decision, ``task.decision``); None = the most probable class.
    threshold: float | None = None

    def class_name(self, index: int) -> str:
        return self.classes[index] if self.classes else str(index)

    def decide(self, outputs: torch.Tensor) -> torch.Tensor:
        """The predicted classes of probabilities (N x C): the most probable class, or for a binary task
        with a :attr:`threshold` the positive class where its probability reaches it."""
        if self.threshold is None or self.kind != "binary":
            return outputs.argmax(1)
        flagged = outputs[:, self.positive] >= self.threshold
        return torch.where(flagged, self.positive, 1 - self.positive)


@dataclass(frozen=True)
class Measurement:
    """One measure taken on one set of examples."""

    #: The measure, in its own units (a recall, an error rate, a mean squared error).
    value: float
    #: What the standard error counts: the examples (error, mean losses), the positives (recall), the
    #: examples flagged positive (precision).
    examples: int
    #: The variance of one counted example's contribution: the mean's variance is this / ``examples``.
    unit_variance: float

    @property
    def standard_error(self) -> float:
        return math.sqrt(self.unit_variance / self.examples) if self.examples else math.nan


class Measure(ABC):
    """A task's measure (one module of this package each kind; registered by ``name``)."""

    name: ClassVar[str]
    #: The measure's torch-free declaration (``config/measure_traits.py``), which its entry point names; the
    #: three traits below are read from it.
    traits: ClassVar[MeasureTraits]
    #: Recall, precision and PR-AUC: a larger value is better. Their :meth:`loss` is 1 - value.
    higher_is_better: ClassVar[bool] = False
    #: The task kinds (:data:`TASK_KINDS`) the measure is defined for.
    kinds: ClassVar[tuple[str, ...]]
    #: A mean of bounded per-example terms in [0, 1] (a rate): its variance is binomial.
    rate: ClassVar[bool] = False
    #: A one-line description for the config reference and reports.
    description: ClassVar[str]
    #: The measure a stage's early stopping reads instead, for a one-sided measure that a degenerate
    #: model maximizes (a recall of 1 by flagging everything); None: this measure itself.
    stopping_measure: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("traits")
        if declared is not None:
            cls.higher_is_better, cls.rate, cls.kinds = declared.higher_is_better, declared.rate, declared.kinds

    def __init__(self, target: Target):
        self.target = target

    @abstractmethod
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        """The measure of ``outputs`` (probabilities N x C, or predictions N) against labels ``y``."""

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(each example's loss, whether it counts), whose mean over the counted examples is :meth:`loss`
        of :meth:`measure`; None where the measure is not such a mean."""
        return None

    def on_resamples(self, outputs: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The measure on each of a batch of bootstrap resamples of the examples, ``counts[b, i]`` times
        example ``i`` in resample ``b`` (B x N, float64): one value per resample, as :meth:`measure` gives
        it on that resample's examples (a measure does not depend on their order). The guard's paired
        bootstrap reads it for a measure without :meth:`per_example`. This default measures one resample
        at a time; a measure the guard resamples overrides it with one batched computation."""
        outputs, y = outputs.detach().cpu(), y.cpu()
        examples = torch.arange(len(y))
        values = []
        for row in counts:
            drawn = examples.repeat_interleave(row.long())
            values.append(self.measure(outputs[drawn], y[drawn]).value)
        return torch.tensor(values, dtype=torch.float64)

    def baseline(self, y: torch.Tensor) -> float:
        """The value of a model that ignores its inputs: the majority class, or the mean target."""
        return self.measure(self.constant_outputs(y), y).value

    def constant_outputs(self, y: torch.Tensor) -> torch.Tensor:
        """The outputs of the input-blind model :meth:`baseline` measures: the labels' frequencies as
        every example's probabilities (its prediction is the majority class); a regression's mean."""
        counts = torch.bincount(y.long(), minlength=self.target.num_classes).double()
        prior = counts / counts.sum().clamp_min(1)
        return prior.expand(len(y), -1)

    def loss(self, value: float) -> float:
        """``value`` on the lower-is-better scale policies and the guard compare on."""
        return 1.0 - value if self.higher_is_better else value

    def variance(self, mean_loss: float, examples: int, unit_variance: float) -> float:
        """Variance of a mean loss taken on ``examples`` counted examples whose per-example variance was
        measured as ``unit_variance``: a rate's is binomial, floored as if at least one counted example
        were a mistake (a zero error is not certain)."""
        examples = max(1, examples)
        if self.rate:
            return max(mean_loss * (1 - mean_loss), 1 / examples) / examples
        return max(unit_variance, 1e-12) / examples

    def shown(self, value: float) -> str:
        """``value`` as reasons and logs show it."""
        return (
            f"{self.name.replace('_', '-')} {value:.4g}"
            if not self.rate
            else f"{self.name.replace('_', ' ')} {value:.3f}"
        )

    def details(self, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """The task's other measures, shown beside this one (binary: error, recall, precision, PR-AUC;
        multi-class: each class's recall). Empty by default."""
        return {}


#: The measures by name, from the entry points of group ``alma_daemon.measures`` (pyproject.toml).
MEASURES = cast("Registry[type[Measure]]", MEASURE_REGISTRY)


#: The measure a task kind is judged by unless ``task.measure`` says otherwise.
DEFAULT_MEASURE = {"binary": "error", "multiclass": "error", "regression": "mse", "language_model": "perplexity"}


def measure_class(name: str) -> type[Measure]:
    try:
        return MEASURES[name]
    except KeyError as unknown:
        raise ValueError(unknown.args[0]) from None


def stopping_measure(measure: Measure) -> Measure:
    """The measure early stopping reads for ``measure`` (:attr:`Measure.stopping_measure`)."""
    name = measure.stopping_measure
    return measure if name is None else measure_class(name)(measure.target)


def build_measure(name: str | None, target: Target) -> Measure:
    """The measure ``name`` (None: the task kind's default) for ``target``; one that does not fit the
    task is refused in one line."""
    chosen = name or DEFAULT_MEASURE[target.kind]
    cls = measure_class(chosen)
    misfit = measure_misfit(chosen, target.kind)
    if misfit is not None:
        raise ValueError(misfit)
    return cls(target)


def mean_measurement(losses: torch.Tensor, rate: bool) -> Measurement:
    """The mean of per-example ``losses`` (float64), with its per-example variance."""
    n = len(losses)
    if n == 0:
        return Measurement(math.nan, 0, math.nan)
    mean = float(losses.mean())
    unit = mean * (1 - mean) if rate else float(losses.var(correction=0))
    return Measurement(mean, n, unit)


def proportion(hits: int, n: int) -> Measurement:
    """A share of ``hits`` among ``n`` (NaN when ``n`` is 0), with its binomial variance."""
    if n == 0:
        return Measurement(math.nan, 0, math.nan)
    p = hits / n
    return Measurement(p, n, p * (1 - p))


def on_cpu(fn: Callable[..., Measurement]) -> Callable[..., Measurement]:
    """Measures read outputs and labels on the CPU, whatever device the model ran on."""

    def wrapped(self: Measure, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        return fn(self, outputs.detach().cpu(), y.cpu())

    return wrapped
