"""The promotion guard's decision: is a new version worse than the live one, or only unlucky on its sample?

The candidate and the live version answer the same validation examples, so their mistakes are
paired. Where both are right or both wrong, an example says nothing about which is better; only
the discordant examples do: ``worse_on`` (the candidate wrong, the live version right) and
``better_on`` (the reverse). Were the two versions equally good, each discordant example would fall
either way with probability 1/2, so the chance of ``worse_on`` or more of them falling against the
candidate is a binomial tail (a one-sided exact McNemar test, :func:`binomial_tail`).

A classifier's candidate is refused only when both hold:

- it is worse by more than ``margin`` (``serving.promotion_margin``, in error units) on the sample;
- the paired test puts the chance of a difference that large between equally good versions
  below ``alpha`` (``serving.promotion_alpha``).

So a version that only looks worse because the sample is small is promoted (a chunk of 120
examples holds out 12: one example is 0.083 of error), and a version worse by at most the margin
is always promoted. The sample is the candidate's own validation sample topped up to
``min_examples`` (``serving.promotion_min_examples``) from the samples saved with the versions
before it (the validation shares of the chunks that trained them): see
:meth:`serving.publisher.Publisher.guard_sample`.

One exception keeps a guard on a pooled sample from holding back a model that follows a changed
stream: where the pool reaches beyond the candidate's own examples, a candidate that its own
examples, the newest, find better than the live version at the same level ``alpha`` is promoted,
whatever the older examples say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from alma_daemon.config import ServingConfig

_DEFAULTS = ServingConfig()


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly (1.0 for k <= 0)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


@dataclass(frozen=True)
class Verdict:
    """What the guard found on one sample; :meth:`PromotionGuard.judge` makes it."""

    promoted: bool
    #: The guard sample's size, and how many of its examples are the candidate's own.
    examples: int
    own_examples: int
    candidate_error: float
    live_error: float
    #: Examples the candidate gets wrong and the live version right, and the reverse.
    worse_on: int
    better_on: int
    #: The one-sided paired test's p-value: the chance of ``worse_on`` or more of the discordant
    #: examples going against the candidate were the two versions equally good.
    p_value: float
    #: The candidate's own examples find it better than the live version (the exception above).
    newest_prefer_candidate: bool = False


@dataclass(frozen=True)
class PromotionGuard:
    """The decision of docs/serving.md's step 2 for classifiers, from the ``serving`` section's keys."""

    margin: float = _DEFAULTS.promotion_margin
    alpha: float = _DEFAULTS.promotion_alpha
    min_examples: int = _DEFAULTS.promotion_min_examples

    def __post_init__(self) -> None:
        if self.margin < 0 or not 0 < self.alpha <= 1 or self.min_examples < 1:
            raise ValueError(f"promotion guard: margin >= 0, 0 < alpha <= 1 and min_examples >= 1; got {self}")

    def judge(self, candidate_wrong: torch.Tensor, live_wrong: torch.Tensor, own_examples: int) -> Verdict:
        """Decide on the paired mistakes of the two versions (bool, one per example of the guard sample,
        the candidate's ``own_examples`` first)."""
        if candidate_wrong.shape != live_wrong.shape or candidate_wrong.ndim != 1 or len(candidate_wrong) == 0:
            raise ValueError(
                f"the guard needs both versions' mistakes on the same examples; got {tuple(candidate_wrong.shape)} "
                f"and {tuple(live_wrong.shape)}"
            )
        candidate_wrong, live_wrong = candidate_wrong.bool().cpu(), live_wrong.bool().cpu()
        n = len(candidate_wrong)
        worse_on, better_on = _discordant(candidate_wrong, live_wrong)
        p_value = binomial_tail(worse_on, worse_on + better_on)
        worse = (worse_on - better_on) / n > self.margin and p_value < self.alpha
        newest_prefer = False
        if worse and 0 < own_examples < n:
            own_worse, own_better = _discordant(candidate_wrong[:own_examples], live_wrong[:own_examples])
            newest_prefer = binomial_tail(own_better, own_worse + own_better) < self.alpha
        return Verdict(
            promoted=not worse or newest_prefer,
            examples=n,
            own_examples=min(own_examples, n),
            candidate_error=int(candidate_wrong.sum()) / n,
            live_error=int(live_wrong.sum()) / n,
            worse_on=worse_on,
            better_on=better_on,
            p_value=p_value,
            newest_prefer_candidate=newest_prefer,
        )


def _discordant(candidate_wrong: torch.Tensor, live_wrong: torch.Tensor) -> tuple[int, int]:
    return int((candidate_wrong & ~live_wrong).sum()), int((live_wrong & ~candidate_wrong).sum())
