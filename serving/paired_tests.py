"""The promotion guard's paired tests: is the candidate's loss larger than the live version's on the same
examples by more than chance would make it?

Each test returns a one-sided p-value: the chance, were the two versions equally good, of a difference
at least as large as the one seen against the candidate.

- :func:`sign_flip_test`, for a measure that is a mean of per-example losses: were the versions equally
  good, each example's loss difference would be as likely ``d`` as ``-d``, so the p-value is the share
  of the 2^m sign patterns whose sum reaches the observed one (a paired randomization test). It weighs
  each example by its difference: a missed fraud costing 10 counts ten false alarms. Where every
  nonzero difference has one size (0/1 losses: error, recall) it is the exact one-sided McNemar test,
  a binomial tail; where the sizes take a few values (a cost's two) it is computed exactly over them;
  otherwise (log-loss, squared errors) from seeded random sign patterns.
- :func:`bootstrap_test`, for a measure that is not such a mean (precision, PR-AUC, balanced error):
  the examples resampled with replacement, the same resample for both versions, seeded; the p-value is
  the share of resamples on which the candidate is not worse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: Random sign patterns (or resamples) at least, and at least this many divided by alpha, so that a
#: p-value below alpha is reachable with room: the smallest a Monte Carlo p-value can be is 1/(R+1).
MONTE_CARLO_SIGN_FLIPS = 20_000
BOOTSTRAP_RESAMPLES = 4_000
RESAMPLES_PER_ALPHA = 4
#: Largest grid of sign-pattern counts (one axis per distinct difference size) computed exactly.
EXACT_CELLS = 1_000_000
#: Random sign patterns drawn per matrix product (bounds the memory: this many x the examples).
FLIP_BATCH = 1_000


@dataclass(frozen=True)
class PairedTest:
    """A one-sided paired test's result."""

    #: "McNemar", "sign-flip" (exact), "sign-flip, Monte Carlo" or "bootstrap".
    name: str
    p_value: float
    #: Examples whose loss is larger in the candidate's answers, and smaller (None for the bootstrap,
    #: whose measure is not a sum over examples).
    worse_on: int | None = None
    better_on: int | None = None


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly (1.0 for k <= 0)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def resamples_for(alpha: float, least: int) -> int:
    return max(least, math.ceil(RESAMPLES_PER_ALPHA / alpha))


def sign_flip_test(differences: torch.Tensor, flips: int, seed: int) -> PairedTest:
    """The test of per-example loss differences (candidate minus live version, float64, one per counted
    example) against the hypothesis that their signs are chance; ``flips`` random sign patterns where
    the exact distribution is too large to compute."""
    nonzero = differences[differences != 0]
    worse_on, better_on = int((nonzero > 0).sum()), int((nonzero < 0).sum())
    sizes = nonzero.abs()
    distinct, counts = torch.unique(sizes, return_counts=True)
    if len(distinct) <= 1:
        return PairedTest("McNemar", binomial_tail(worse_on, worse_on + better_on), worse_on, better_on)
    observed = float(nonzero.sum())
    # Sums of the same terms in another order differ in their last bits.
    slack = 1e-9 * float(sizes.sum())
    if math.prod(c + 1 for c in counts.tolist()) <= EXACT_CELLS:
        p_value = _exact_tail(distinct.tolist(), counts.tolist(), observed - slack)
        return PairedTest("sign-flip", p_value, worse_on, better_on)
    generator = torch.Generator().manual_seed(seed)
    reached = 0
    for start in range(0, flips, FLIP_BATCH):
        positive = torch.randint(
            0, 2, (min(FLIP_BATCH, flips - start), len(sizes)), generator=generator, dtype=sizes.dtype
        )
        # The sum with these signs: the positive terms minus the others.
        sums = 2 * (positive @ sizes) - sizes.sum()
        reached += int((sums >= observed - slack).sum())
    return PairedTest("sign-flip, Monte Carlo", (1 + reached) / (1 + flips), worse_on, better_on)


def _exact_tail(sizes: list[float], counts: list[int], threshold: float) -> float:
    """P(sum >= threshold) where ``counts[i]`` differences of size ``sizes[i]`` each take either sign
    with probability 1/2: over the grid of how many of each size are positive."""
    sums = torch.zeros(1, dtype=torch.float64)
    chances = torch.ones(1, dtype=torch.float64)
    for size, m in zip(sizes, counts, strict=True):
        j = torch.arange(m + 1, dtype=torch.float64)
        log_pmf = math.lgamma(m + 1) - torch.lgamma(j + 1) - torch.lgamma(m - j + 1) - m * math.log(2)
        sums = (sums[:, None] + size * (2 * j - m)[None, :]).reshape(-1)
        chances = (chances[:, None] * log_pmf.exp()[None, :]).reshape(-1)
    return min(1.0, float(chances[sums >= threshold].sum()))


def bootstrap_test(loss_difference: Callable[[torch.Tensor], float], n: int, resamples: int, seed: int) -> PairedTest:
    """The share of ``resamples`` paired resamples of ``n`` examples on which ``loss_difference`` (of the
    examples at the given indexes: the candidate's loss minus the live version's) is not positive, with
    the observed sample counted as one of them. A resample on which the measure is undefined (NaN:
    PR-AUC without a positive) counts as not worse: it shows nothing against the candidate."""
    generator = torch.Generator().manual_seed(seed)
    not_worse = 0
    for _ in range(resamples):
        not_worse += not loss_difference(torch.randint(0, n, (n,), generator=generator)) > 0
    return PairedTest("bootstrap", (1 + not_worse) / (1 + resamples))
