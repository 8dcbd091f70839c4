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
  the share of resamples on which the candidate is not worse. The resamples are drawn and measured in
  batches (:func:`resample_counts`, :meth:`alma_daemon.measures.Measure.on_resamples`): 4,000 resamples
  of 2,000 examples take a fraction of a second where measuring them one at a time took seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
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
#: Resamples x examples of one batch of bootstrap resamples (bounds the memory: 8 MB a float64 matrix
#: of them, and a measure makes a few).
BOOTSTRAP_CELLS = 1_000_000
#: Difference below which two versions' losses on a resample are a tie, relative to the larger of 1 and
#: the losses: a measure's rounding is of its value (a rate's, up to 1, whatever its loss), and two equal
#: values reached by other sums (a PR-AUC of 1 each, recalls 1/4 + 3/4 against 1/2 + 1/2) differ in their
#: last bits, which counted as worse at random before; a batched measure adds its terms in another order.
TIE = 1e-12


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
    # Exact integers over the shorter side (P(X >= k) = 1 - P(X < k)), so a guard sample of 6,000
    # examples that all disagree sums 3,000 terms, not 6,000 comb() calls (seconds); the ratio of two
    # exact integers rounds once, so the value is the same either way.
    if 2 * k > n:
        return _binomial_sum(n, k, n) / 2**n
    return (2**n - _binomial_sum(n, 0, k - 1)) / 2**n


def _binomial_sum(n: int, low: int, high: int) -> int:
    """The sum of comb(n, i) for i from ``low`` to ``high``, each term from the one before."""
    term = math.comb(n, low)
    total = term
    for i in range(low, high):
        term = term * (n - i) // (i + 1)
        total += term
    return total


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
        # Drawn as int32, the same numbers as drawn as float64 (the generator gives each element one
        # draw whatever the dtype), in a third of the time.
        positive = torch.randint(
            0, 2, (min(FLIP_BATCH, flips - start), len(sizes)), generator=generator, dtype=torch.int32
        ).to(sizes.dtype)
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


def resample_counts(n: int, resamples: int, seed: int) -> Iterator[torch.Tensor]:
    """The paired bootstrap's ``resamples`` resamples of ``n`` examples, in batches of rows: ``counts[b, i]``
    is how many times example ``i`` is drawn in resample ``b`` (float64, so that sums of counts are exact).

    Resample ``b`` holds the indexes that the ``b``-th of ``resamples`` calls ``torch.randint(0, n, (n,))``
    on a generator seeded with ``seed`` would draw: one call for a batch's indexes takes the same numbers
    from the generator, so the p-values are those of drawing one resample at a time."""
    generator = torch.Generator().manual_seed(seed)
    rows = max(1, BOOTSTRAP_CELLS // max(1, n))
    for start in range(0, resamples, rows):
        drawn = torch.randint(0, n, (min(rows, resamples - start), n), generator=generator)
        counts = torch.zeros(drawn.shape, dtype=torch.float64)
        yield counts.scatter_add_(1, drawn, torch.ones(drawn.shape, dtype=torch.float64))


def bootstrap_test(
    losses: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], n: int, resamples: int, seed: int
) -> PairedTest:
    """The share of ``resamples`` paired resamples of ``n`` examples on which the version under suspicion is
    not worse, with the observed sample counted as one of them. ``losses(counts)`` gives, for a batch of
    resamples (:func:`resample_counts`), the suspect's loss and the other version's on each (lower is
    better); the suspect is worse on a resample where its loss is larger beyond rounding (:data:`TIE`). A
    resample on which the measure is undefined (NaN: PR-AUC without a positive) counts as not worse: it
    shows nothing against the suspect."""
    not_worse = 0
    for counts in resample_counts(n, resamples, seed):
        suspect, other = losses(counts)
        # NaN compares as not worse, as it should.
        worse = suspect - other > TIE * torch.maximum(suspect.abs(), other.abs()).clamp_min(1.0)
        not_worse += len(worse) - int(worse.sum())
    return PairedTest("bootstrap", (1 + not_worse) / (1 + resamples))
