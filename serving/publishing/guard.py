"""The promotion guard's decision: is a new version worse than the live one on the task's measure, or only
unlucky on its sample?

The candidate and the live version answer the same validation examples, so their losses are paired,
and the guard judges them on the task's measure (``task.measure``, :mod:`alma_daemon.measures`) with a
one-sided paired test (:mod:`serving.publishing.paired_tests`): for a mean of per-example losses (error, recall,
cost, log-loss, MSE, MAE) a sign-flip test on the loss differences of the examples the measure counts
(for 0/1 losses, error and recall, the exact McNemar test), for any other measure (precision, PR-AUC,
balanced error) a paired bootstrap. A candidate is refused only when both hold:

- its loss (:meth:`~alma_daemon.measures.Measure.loss`: the measure on a lower-is-better scale,
  1 - recall for a recall) exceeds the live version's by more than ``margin``
  (``serving.promotion_margin``, in those units) on the sample;
- the paired test puts the chance of a difference that large between equally good versions below
  ``alpha`` (``serving.promotion_alpha``).

A binary task's headline measure can hide its minority: on 2 % positives, a version that never flags
one loses only 0.02 of error. So, whatever the measure, the guard also tests the positive class's
recall (McNemar on the positives, ``serving.guard_positive_recall``) and refuses a candidate that
finds significantly fewer of them than the live version, at the same ``alpha`` and without a margin.
A candidate that misses every positive is refused once the live version finds 10 of them in the
sample (2^-10 < 0.001): the sample is topped up to ``min_positives`` positives
(``serving.promotion_min_positives``), see :meth:`serving.publishing.publisher.Publisher.guard_sample`.

One exception keeps a guard on a pooled sample from holding back a model that follows a changed
stream: where the pool reaches beyond the candidate's own examples, a test whose own examples, the
newest, find the candidate better than the live version at the same level ``alpha`` does not refuse
it, whatever the older examples say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from alma_daemon.config import ServingConfig
from alma_daemon.measures import Measure
from alma_daemon.measures.binary import Recall
from serving.publishing.paired_tests import (
    BOOTSTRAP_RESAMPLES,
    MONTE_CARLO_SIGN_FLIPS,
    PairedTest,
    bootstrap_test,
    resamples_for,
    sign_flip_test,
)

_DEFAULTS = ServingConfig()


@dataclass(frozen=True)
class Comparison:
    """The candidate against the live version on one measure of the guard sample."""

    measure: str
    #: The two versions' values, in the measure's own units.
    candidate_value: float
    live_value: float
    #: The examples the measure counts: all of them, or the positives for a recall.
    counted: int
    test: PairedTest
    #: Worse by more than the margin, at ``alpha``.
    worse: bool
    #: The candidate's own examples find it better at ``alpha`` (the exception above).
    newest_prefer_candidate: bool = False

    @property
    def refuses(self) -> bool:
        return self.worse and not self.newest_prefer_candidate


@dataclass(frozen=True)
class Verdict:
    """What the guard found on one sample; :meth:`PromotionGuard.judge` makes it."""

    promoted: bool
    #: The guard sample's size, and how many of its examples are the candidate's own.
    examples: int
    own_examples: int
    #: On the task's measure.
    headline: Comparison
    #: Binary tasks (``serving.guard_positive_recall``): the positive class's recall; None otherwise, and
    #: where the task's measure is that recall.
    positive_recall: Comparison | None
    #: Binary tasks: the positives the sample held.
    positives: int | None
    #: One line: the measure's values, the test, and why the candidate is refused or promoted.
    reason: str


@dataclass(frozen=True)
class PromotionGuard:
    """The decision of docs/serving.md's step 2 for classifiers and regressions, from the ``serving``
    section's keys."""

    margin: float = _DEFAULTS.promotion_margin
    alpha: float = _DEFAULTS.promotion_alpha
    min_examples: int = _DEFAULTS.promotion_min_examples
    min_positives: int = _DEFAULTS.promotion_min_positives
    positive_recall: bool = _DEFAULTS.guard_positive_recall
    #: Seeds the Monte Carlo sign flips and the bootstrap, so a decision is the same on every run.
    seed: int = 0

    def __post_init__(self) -> None:
        if self.margin < 0 or not 0 < self.alpha <= 1 or self.min_examples < 1 or self.min_positives < 0:
            raise ValueError(
                f"promotion guard: margin >= 0, 0 < alpha <= 1, min_examples >= 1 and min_positives >= 0; got {self}"
            )

    def judge(
        self, measure: Measure, candidate: torch.Tensor, live: torch.Tensor, y: torch.Tensor, own_examples: int
    ) -> Verdict:
        """Decide on the two versions' outputs (:meth:`alma_daemon.learners.Learner.outputs`) for the guard
        sample's examples, whose labels are ``y``, the candidate's ``own_examples`` first."""
        if candidate.shape != live.shape or len(candidate) != len(y) or len(y) == 0:
            raise ValueError(
                f"the guard needs both versions' outputs on the same examples; got {tuple(candidate.shape)} and "
                f"{tuple(live.shape)} for {len(y)} labels"
            )
        candidate, live, y = candidate.detach().cpu(), live.detach().cpu(), y.cpu()
        own = min(own_examples, len(y))
        compared = [(measure, self._compare(measure, candidate, live, y, own, self.margin))]
        positives = None
        if measure.target.kind == "binary":
            positives = int((y == measure.target.positive).sum())
            if self.positive_recall and not isinstance(measure, Recall):
                recall = Recall(measure.target)
                # Any significant loss of the minority refuses: its margin is 0.
                compared.append((recall, self._compare(recall, candidate, live, y, own, 0.0)))
        return Verdict(
            promoted=not any(c.refuses for _, c in compared),
            examples=len(y),
            own_examples=own,
            headline=compared[0][1],
            positive_recall=compared[1][1] if len(compared) > 1 else None,
            positives=positives,
            reason=self._reason(compared, len(y), positives, own),
        )

    def _compare(
        self, measure: Measure, candidate: torch.Tensor, live: torch.Tensor, y: torch.Tensor, own: int, margin: float
    ) -> Comparison:
        values = measure.measure(candidate, y).value, measure.measure(live, y).value
        flips = resamples_for(self.alpha, MONTE_CARLO_SIGN_FLIPS)
        paired = _loss_differences(measure, candidate, live, y)
        if paired is not None:
            differences, counted = paired
            kept = differences[counted]
            # The mean of the differences: for 0/1 losses exactly (worse_on - better_on) / counted.
            difference = float(kept.sum()) / len(kept) if len(kept) else math.nan
            test = sign_flip_test(kept, flips, self.seed)
        else:
            difference = measure.loss(values[0]) - measure.loss(values[1])
            test = self._bootstrap(measure, candidate, live, y, against_candidate=True)
            counted = torch.ones(len(y), dtype=torch.bool)
        worse = difference > margin and test.p_value < self.alpha
        newest_prefer = False
        if worse and 0 < own < len(y):
            if paired is not None:
                newest = sign_flip_test(-differences[:own][counted[:own]], flips, self.seed)
            else:
                newest = self._bootstrap(measure, candidate[:own], live[:own], y[:own], against_candidate=False)
            newest_prefer = newest.p_value < self.alpha
        return Comparison(measure.name, *values, int(counted.sum()), test, worse, newest_prefer)

    def _bootstrap(
        self, measure: Measure, candidate: torch.Tensor, live: torch.Tensor, y: torch.Tensor, against_candidate: bool
    ) -> PairedTest:
        """The bootstrap test that the candidate's loss is larger (``against_candidate``), or smaller."""

        def losses(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            candidate_losses = _losses(measure, measure.on_resamples(candidate, y, counts))
            live_losses = _losses(measure, measure.on_resamples(live, y, counts))
            return (candidate_losses, live_losses) if against_candidate else (live_losses, candidate_losses)

        return bootstrap_test(losses, len(y), resamples_for(self.alpha, BOOTSTRAP_RESAMPLES), self.seed)

    def _reason(
        self, compared: list[tuple[Measure, Comparison]], examples: int, positives: int | None, own: int
    ) -> str:
        refusing = [(m, c) for m, c in compared if c.refuses]
        parts = [self._explain(m, c) for m, c in refusing or compared]
        if positives is not None and positives < self.min_positives:
            parts.append(
                f"the sample held {positives} {_positive_name(compared[0][0])} examples, fewer than "
                f"promotion_min_positives {self.min_positives}"
            )
        excused = [c.measure for _, c in compared if c.newest_prefer_candidate]
        if excused and not refusing:
            parts.append(f"its own {own} examples, the newest, find it better on {', '.join(excused)}")
        return f"on {examples} examples, " + "; ".join(parts)

    def _explain(self, measure: Measure, comparison: Comparison) -> str:
        test = comparison.test
        p = f"{test.name} p = {test.p_value:.2g}"
        if comparison.refuses:
            p += f" < promotion_alpha {self.alpha:g}"
        if isinstance(measure, Recall):
            name = _positive_name(measure)
            values = (
                f"recall of {name} {comparison.candidate_value:.2f} against the live version's "
                f"{comparison.live_value:.2f} on the {comparison.counted} {name} examples"
            )
            if not comparison.refuses:
                return f"{values} ({p})"
            return f"{values}: it misses {test.worse_on} that the live version finds, finds {test.better_on} it misses ({p})"
        values = f"{measure.shown(comparison.candidate_value)} against the live version's {measure.shown(comparison.live_value)}"
        if not comparison.refuses:
            return f"{values} ({p})"
        counts = f"; worse on {test.worse_on}, better on {test.better_on}" if test.worse_on is not None else ""
        return f"{values}: worse by more than promotion_margin {self.margin:g} ({p}{counts})"


def _loss_differences(
    measure: Measure, candidate: torch.Tensor, live: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each example's loss in the candidate's answers minus the live version's, and whether the measure
    counts it; None for a measure that is not a mean over examples."""
    candidate_losses, live_losses = measure.per_example(candidate, y), measure.per_example(live, y)
    if candidate_losses is None or live_losses is None:
        return None
    return candidate_losses[0] - live_losses[0], candidate_losses[1]


def _losses(measure: Measure, values: torch.Tensor) -> torch.Tensor:
    """Values of ``measure`` on its lower-is-better scale (:meth:`~alma_daemon.measures.Measure.loss`), one
    at a time: the same arithmetic as the guard's difference of the two versions' values, and any measure's
    own scale (a perplexity's log)."""
    return torch.tensor([measure.loss(value) for value in values.tolist()], dtype=torch.float64)


def _positive_name(measure: Measure) -> str:
    target = measure.target
    return target.classes[target.positive] if target.classes else f"class {target.positive}"
