"""The promotion guard's decision (serving/publishing/guard.py, serving/publishing/paired_tests.py):
judged on the task's measure, right about noise, never fooled by a truly worse version, and protective
of a binary task's minority.

The versions here are outputs drawn with seeded generators, so the rates are exact and the tests
deterministic; the publisher's tests at the end guard real checkpoints (tests/test_serving_local.py
has more).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
from pathlib import Path

import pytest
import torch

from alma_daemon.config import ConfigError, ServingConfig, build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.measures import MEASURES, Measure, Target, build_measure
from serving.publishing import guard as guard_module
from serving.publishing import make_publisher, paired_tests
from serving.publishing.guard import PromotionGuard, Verdict
from serving.publishing.local import LocalPublisher
from serving.publishing.paired_tests import binomial_tail, resample_counts, sign_flip_test
from tests.helpers.data import separable_data
from tests.helpers.serving import new_learner, quick_trainer, save_version

TEN_CLASSES = Target("multiclass", 10)
FRAUD = Target("binary", 2, classes=("ok", "fraud"), positive=1)


def answers(predicted: torch.Tensor, classes: int = 2) -> torch.Tensor:
    """Probabilities (N x C) whose most probable class is ``predicted``."""
    return torch.nn.functional.one_hot(predicted.long(), classes).double()


def judge_mistakes(guard: PromotionGuard, candidate_wrong: torch.Tensor, live_wrong: torch.Tensor, own: int) -> Verdict:
    """The guard on the error rate of a ten-class task, from the two versions' mistakes (class 0 is right)."""
    y = torch.zeros(len(candidate_wrong), dtype=torch.long)
    error = build_measure("error", TEN_CLASSES)
    return guard.judge(error, answers(candidate_wrong, 10), answers(live_wrong, 10), y, own)


def paired_mistakes(
    n: int, live_error: float, candidate_error: float, gen: torch.Generator, shared: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two versions' mistakes on the same ``n`` examples: a share ``shared`` of the live version's
    mistakes are the candidate's too (versions fine-tuned from one another err on the same hard
    examples), the rest of each version's mistakes fall on examples of their own."""
    hard = torch.rand(n, generator=gen) < live_error * shared
    live = hard | (torch.rand(n, generator=gen) < live_error * (1 - shared) / (1 - live_error * shared))
    extra = (candidate_error - live_error * shared) / (1 - live_error * shared)
    candidate = hard | (torch.rand(n, generator=gen) < extra)
    return candidate, live


def refused_share(guard: PromotionGuard, trials: int, n: int, own: int, live_error: float, candidate_error: float):
    gen = torch.Generator().manual_seed(1234)
    refused = 0
    for _ in range(trials):
        candidate, live = paired_mistakes(n, live_error, candidate_error, gen)
        refused += not judge_mistakes(guard, candidate, live, own).promoted
    return refused / trials


def fraud_sample(n: int, frauds: int) -> torch.Tensor:
    y = torch.zeros(n, dtype=torch.long)
    y[:frauds] = 1
    return y


# -- the error rate: the verdicts and numbers of the guard before it judged on the task's measure -------
def test_the_binomial_tail_is_exact():
    for n in range(0, 13):
        for k in range(-1, n + 2):
            expected = sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2**n
            assert binomial_tail(k, n) == pytest.approx(expected, abs=0)
    assert binomial_tail(10, 11) == 12 / 2048
    assert 0 < binomial_tail(400, 500) < 1e-40
    # Summed over the shorter side of a large sample (6,000 discordant examples took seconds before).
    for k in (1, 300, 500, 501, 502, 800):
        assert binomial_tail(k, 1001) == sum(math.comb(1001, i) for i in range(k, 1002)) / 2**1001
    assert binomial_tail(1, 6000) == (2**6000 - 1) / 2**6000


def test_the_issues_noise_is_promoted_where_the_margin_alone_refused_it():
    """A 12-example sample: the candidate wrong on 5, the live version on 4 (0.4167 against 0.3333)."""
    live = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    candidate = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    verdict = judge_mistakes(PromotionGuard(margin=0.01), candidate, live, own=12)
    headline = verdict.headline
    assert (headline.measure, headline.candidate_value, headline.live_value) == ("error", 5 / 12, 4 / 12)
    assert (headline.test.name, headline.test.worse_on, headline.test.better_on, headline.test.p_value) == (
        "McNemar",
        2,
        1,
        0.5,
    )
    assert verdict.promoted and verdict.positive_recall is None and verdict.positives is None
    assert verdict.reason == "on 12 examples, error 0.417 against the live version's error 0.333 (McNemar p = 0.5)"
    # The guard before it (the margin alone) refused this: alpha 1 leaves only the margin.
    assert not judge_mistakes(PromotionGuard(margin=0.01, alpha=1.0), candidate, live, own=12).promoted


@pytest.mark.parametrize(("n", "own"), [(12, 12), (300, 12), (600, 600)])
def test_equally_good_versions_are_refused_at_most_alpha_of_the_time(n, own):
    share = refused_share(PromotionGuard(margin=0.01, alpha=0.01), 2000, n, own, live_error=0.08, candidate_error=0.08)
    assert share <= 0.01


@pytest.mark.parametrize("alpha", [0.05, 0.001])
def test_equally_good_versions_are_refused_at_most_alpha_of_the_time_without_a_margin(alpha):
    share = refused_share(PromotionGuard(margin=0.0, alpha=alpha), 2000, 300, 12, live_error=0.08, candidate_error=0.08)
    assert share <= alpha


def test_a_version_worse_by_no_more_than_the_margin_is_always_promoted():
    # 3 more mistakes in 300 examples, nowhere better: as significant as 3 can be (p = 1/8), yet within 0.01.
    live = torch.zeros(300, dtype=torch.bool)
    candidate = live.clone()
    candidate[:3] = True
    assert judge_mistakes(PromotionGuard(margin=0.01, alpha=1.0), candidate, live, 12).promoted
    candidate[:4] = True
    assert not judge_mistakes(PromotionGuard(margin=0.01, alpha=1.0), candidate, live, 12).promoted


@pytest.mark.parametrize("candidate_error", [0.9, 0.5, 0.3])
def test_a_clearly_worse_version_is_always_refused(candidate_error):
    share = refused_share(PromotionGuard(), 500, 300, 12, live_error=0.05, candidate_error=candidate_error)
    assert share == 1.0


def test_a_small_sample_alone_lets_a_moderately_worse_version_through_where_a_pooled_one_does_not():
    """Why the guard tops its sample up: 12 examples cannot tell 0.05 from 0.3 error at promotion_alpha."""
    own_only = refused_share(PromotionGuard(min_examples=1), 500, 12, 12, live_error=0.05, candidate_error=0.3)
    pooled = refused_share(PromotionGuard(), 500, 300, 12, live_error=0.05, candidate_error=0.3)
    assert own_only < 0.05 and pooled == 1.0


def test_a_candidate_its_newest_examples_prefer_is_promoted_whatever_the_older_ones_say():
    """A changed stream: the candidate learned the new labels (its own 12 examples), the live version
    still answers the old ones (the 288 examples topped up from earlier versions)."""
    candidate = torch.cat([torch.zeros(12, dtype=torch.bool), torch.ones(288, dtype=torch.bool)])
    live = ~candidate
    verdict = judge_mistakes(PromotionGuard(), candidate, live, own=12)
    assert verdict.promoted and verdict.headline.newest_prefer_candidate and verdict.headline.worse
    assert verdict.headline.test.p_value < 1e-50
    assert verdict.reason.endswith("its own 12 examples, the newest, find it better on error")
    # Its own examples undecided (6 each way): the older ones decide, and refuse it.
    candidate[:6] = True
    live[:6] = False
    verdict = judge_mistakes(PromotionGuard(), candidate, live, own=12)
    assert not verdict.promoted and not verdict.headline.newest_prefer_candidate


def test_the_guard_needs_both_versions_outputs_on_the_same_examples():
    error = build_measure("error", TEN_CLASSES)
    with pytest.raises(ValueError, match="same examples"):
        PromotionGuard().judge(error, torch.zeros(3, 10), torch.zeros(4, 10), torch.zeros(3), 3)
    with pytest.raises(ValueError, match="alpha"):
        PromotionGuard(alpha=0.0)
    with pytest.raises(ValueError, match="min_positives"):
        PromotionGuard(min_positives=-1)


# -- a binary task's minority -------------------------------------------------------------------------
def test_the_issues_exact_case_shows_its_six_frauds_are_too_few_and_thirty_refuse_it():
    """Issue 42: on 2 % fraud, a candidate wrong on all 6 frauds of 300 examples against a live version
    that misses 1 fraud and raises 1 false alarm. No paired test can refuse on 5 discordant examples
    at 0.001 (the smallest p is 2^-5), so the guard says how few positives it had; the publisher tops
    its sample up to promotion_min_positives (test below), where the same versions are refused."""
    y = fraud_sample(300, 6)
    live = y.clone()
    live[0], live[100] = 0, 1
    verdict = PromotionGuard().judge(build_measure("error", FRAUD), answers(torch.zeros(300)), answers(live), y, 12)
    assert (verdict.headline.test.worse_on, verdict.headline.test.better_on) == (5, 1)
    assert verdict.headline.test.p_value == pytest.approx(0.109, abs=1e-3)
    assert verdict.positives == 6 and verdict.positive_recall is not None
    assert verdict.positive_recall.test.p_value == 2**-5
    assert verdict.reason.endswith("the sample held 6 fraud examples, fewer than promotion_min_positives 30")
    # The same rates on 1,500 examples, 30 frauds: the live version finds 21.
    y = fraud_sample(1500, 30)
    live = y.clone()
    live[:9], live[100:105] = 0, 1
    verdict = PromotionGuard().judge(build_measure("error", FRAUD), answers(torch.zeros(1500)), answers(live), y, 12)
    assert not verdict.promoted and not verdict.headline.refuses and verdict.positive_recall.refuses
    assert verdict.reason == (
        "on 1500 examples, recall of fraud 0.00 against the live version's 0.70 on the 30 fraud examples: it misses "
        "21 that the live version finds, finds 0 it misses (McNemar p = 4.8e-07 < promotion_alpha 0.001)"
    )
    assert (
        PromotionGuard(positive_recall=False)
        .judge(build_measure("error", FRAUD), answers(torch.zeros(1500)), answers(live), y, 12)
        .promoted
    )


def test_equally_good_binary_versions_are_refused_at_most_twice_alpha_of_the_time():
    """Two tests at alpha each (the measure, the positives' recall): at most 2 alpha together."""
    gen = torch.Generator().manual_seed(7)
    y = fraud_sample(1500, 30)
    error = build_measure("error", FRAUD)
    refused = 0
    for _ in range(500):
        # Each version finds a fraud with chance 0.7 and raises a false alarm with chance 0.005.
        found = torch.rand(2, 1500, generator=gen) < torch.where(y == 1, 0.7, 0.005)
        verdict = PromotionGuard(alpha=0.01).judge(error, answers(found[0]), answers(found[1]), y, 12)
        refused += not verdict.promoted
    assert refused / 500 <= 0.02


def test_the_cost_measure_weighs_a_missed_fraud_as_its_cost():
    """15 more frauds missed, 30 fewer false alarms: by count the candidate is better; at 10 a miss and 1 an
    alarm its cost is 90 higher in 1,500 examples, beyond chance (an exact sign-flip test over the two
    sizes), and refused. With the costs the other way round it is better, and promoted."""
    y = fraud_sample(1500, 30)
    live = y.clone()
    live[100:130] = 1  # 30 false alarms
    candidate = y.clone()
    candidate[:15] = 0  # 15 frauds missed
    guard = PromotionGuard(positive_recall=False)
    costly_misses = Target("binary", 2, positive=1, false_negative_cost=10.0, false_positive_cost=1.0)
    verdict = guard.judge(build_measure("cost", costly_misses), answers(candidate), answers(live), y, 12)
    headline = verdict.headline
    assert (headline.candidate_value, headline.live_value) == (150 / 1500, 30 / 1500)
    assert (headline.test.name, headline.test.worse_on, headline.test.better_on) == ("sign-flip", 15, 30)
    assert headline.test.p_value < 0.001 and not verdict.promoted
    assert verdict.reason.startswith("on 1500 examples, cost 0.1 against the live version's cost 0.02: worse by")
    # The exact tail, by enumeration of its two binomials.
    expected = sum(
        math.comb(15, j) * math.comb(30, k) / 2**45
        for j in range(16)
        for k in range(31)
        if 10 * (2 * j - 15) + (2 * k - 30) >= 120
    )
    assert headline.test.p_value == pytest.approx(expected, rel=1e-9)
    # The error rate counts them alike: the candidate is better.
    assert (
        guard.judge(build_measure("error", FRAUD), answers(candidate), answers(live), y, 12).headline.test.p_value
        > 0.99
    )
    costly_alarms = Target("binary", 2, positive=1, false_negative_cost=1.0, false_positive_cost=10.0)
    assert guard.judge(build_measure("cost", costly_alarms), answers(candidate), answers(live), y, 12).promoted


def test_unit_costs_give_the_error_rates_mcnemar_test():
    y = fraud_sample(300, 6)
    live, candidate = y.clone(), torch.zeros(300)
    live[0], live[100] = 0, 1
    cost = PromotionGuard().judge(build_measure("cost", FRAUD), answers(candidate), answers(live), y, 12).headline
    error = PromotionGuard().judge(build_measure("error", FRAUD), answers(candidate), answers(live), y, 12).headline
    assert (cost.test, cost.candidate_value, cost.live_value) == (error.test, error.candidate_value, error.live_value)


def test_the_recall_measure_is_tested_on_the_positives_alone():
    y = fraud_sample(1500, 30)
    live = y.clone()
    live[:5] = 0
    candidate = y.clone()
    candidate[:20] = 0
    candidate[30:] = 0
    live[30:400] = 1  # the live version's many false alarms do not count for a recall
    verdict = PromotionGuard().judge(build_measure("recall", FRAUD), answers(candidate), answers(live), y, 12)
    headline = verdict.headline
    assert (headline.measure, headline.counted, headline.candidate_value, headline.live_value) == (
        "recall",
        30,
        10 / 30,
        25 / 30,
    )
    assert (headline.test.worse_on, headline.test.better_on) == (15, 0)
    assert not verdict.promoted and verdict.positive_recall is None  # the measure is that recall
    assert verdict.reason.startswith("on 1500 examples, recall of fraud 0.33 against the live version's 0.83 on the 30")


def precision_recall_outputs(y: torch.Tensor, gen: torch.Generator, skill: float) -> torch.Tensor:
    """Scores that rank the positives higher the larger ``skill``."""
    score = torch.sigmoid(torch.randn(len(y), generator=gen, dtype=torch.float64) + skill * y)
    return torch.stack([1 - score, score], 1)


def test_pr_auc_is_judged_by_a_seeded_paired_bootstrap():
    gen = torch.Generator().manual_seed(3)
    y = fraud_sample(400, 20)
    live = precision_recall_outputs(y, gen, skill=4.0)
    pr_auc = build_measure("pr_auc", FRAUD)
    guard = PromotionGuard(positive_recall=False)
    verdict = guard.judge(pr_auc, precision_recall_outputs(y, gen, skill=0.0), live, y, 400)
    assert verdict.headline.test.name == "bootstrap" and verdict.headline.test.worse_on is None
    assert verdict.headline.live_value - verdict.headline.candidate_value > 0.5
    assert not verdict.promoted and verdict.headline.test.p_value < 0.001
    # A version as good: the same scores, slightly shuffled among the negatives.
    alike = live.clone()
    alike[20:] = alike[20:][torch.randperm(380, generator=gen)]
    verdict = guard.judge(pr_auc, alike, live, y, 400)
    assert verdict.promoted and verdict.headline.test.p_value > 0.01
    assert verdict == guard.judge(pr_auc, alike, live, y, 400)


def test_a_version_that_flags_nothing_is_refused_on_precision_and_on_the_positives_recall():
    y = fraud_sample(600, 20)
    verdict = PromotionGuard().judge(build_measure("precision", FRAUD), answers(torch.zeros(600)), answers(y), y, 12)
    assert verdict.headline.test.name == "bootstrap" and not verdict.promoted
    assert verdict.positive_recall is not None and verdict.positive_recall.refuses


def test_a_resample_on_which_the_measure_is_undefined_counts_as_not_worse():
    """PR-AUC without a positive is undefined: such resamples show nothing against the candidate."""
    y = fraud_sample(60, 1)
    live = answers(y)
    candidate = answers(1 - y)
    verdict = PromotionGuard(positive_recall=False).judge(build_measure("pr_auc", FRAUD), candidate, live, y, 60)
    undefined_share = (59 / 60) ** 60  # resamples that miss the one positive
    assert verdict.headline.test.p_value == pytest.approx(undefined_share, abs=0.03)


def test_a_regression_is_judged_by_a_seeded_sign_flip_test_on_squared_errors():
    gen = torch.Generator().manual_seed(5)
    y = torch.randn(500, generator=gen, dtype=torch.float64)
    live = y + 0.5 * torch.randn(500, generator=gen, dtype=torch.float64)
    worse = y + 0.8 * torch.randn(500, generator=gen, dtype=torch.float64)
    alike = y + 0.5 * torch.randn(500, generator=gen, dtype=torch.float64)
    mse = build_measure("mse", Target("regression"))
    verdict = PromotionGuard().judge(mse, worse, live, y, 12)
    assert verdict.headline.test.name == "sign-flip, Monte Carlo" and verdict.positives is None
    assert not verdict.promoted and verdict.headline.test.p_value < 0.001
    assert verdict.reason.startswith("on 500 examples, mse ")
    assert PromotionGuard().judge(mse, alike, live, y, 12).promoted
    assert PromotionGuard().judge(mse, worse, live, y, 12) == verdict
    # A margin in the measure's own units: squared units of the target.
    assert PromotionGuard(margin=1.0).judge(mse, worse, live, y, 12).promoted


def test_the_sign_flip_test_is_the_binomial_tail_where_every_difference_has_one_size():
    differences = torch.tensor([2.5] * 9 + [-2.5] * 2 + [0.0] * 5, dtype=torch.float64)
    test = sign_flip_test(differences, flips=100, seed=0)
    assert (test.name, test.p_value, test.worse_on, test.better_on) == ("McNemar", binomial_tail(9, 11), 9, 2)


def test_a_monte_carlo_sign_flip_p_value_is_close_to_the_exact_one(monkeypatch):
    gen = torch.Generator().manual_seed(11)
    differences = torch.randn(14, generator=gen, dtype=torch.float64) + 0.6
    exact = sign_flip_test(differences, flips=1, seed=0)
    signs = torch.tensor([[1 if i >> b & 1 else -1 for b in range(14)] for i in range(2**14)], dtype=torch.float64)
    enumerated = float(((signs @ differences.abs()) >= float(differences.sum()) - 1e-9).double().mean())
    assert exact.name == "sign-flip" and exact.p_value == pytest.approx(enumerated, rel=1e-9)
    monkeypatch.setattr(paired_tests, "EXACT_CELLS", 0)
    sampled = sign_flip_test(differences, flips=100_000, seed=0)
    assert sampled.name == "sign-flip, Monte Carlo" and sampled.p_value == pytest.approx(enumerated, abs=0.003)
    assert sampled == sign_flip_test(differences, flips=100_000, seed=0)


# -- the paired bootstrap, batched --------------------------------------------------------------------
def loop_bootstrap(
    measure: Measure, suspect: torch.Tensor, other: torch.Tensor, y: torch.Tensor, resamples: int, seed: int
) -> float:
    """The reference: the paired bootstrap one resample of indexes at a time from the seeded generator,
    each measured by ``Measure.measure``, as the guard ran it before it was batched; but for its ties:
    two values equal but for their last bits (a PR-AUC of 1 each, reached by other sums) are a tie, where
    before their rounding counted as worse at random (paired_tests.TIE)."""
    generator = torch.Generator().manual_seed(seed)
    not_worse = 0
    for _ in range(resamples):
        at = torch.randint(0, len(y), (len(y),), generator=generator)
        losses = (
            measure.loss(measure.measure(suspect[at], y[at]).value),
            measure.loss(measure.measure(other[at], y[at]).value),
        )
        not_worse += not losses[0] - losses[1] > 1e-12 * max(1.0, *map(abs, losses))
    return (1 + not_worse) / (1 + resamples)


def random_probabilities(n: int, classes: int, gen: torch.Generator, decimals: int | None = None) -> torch.Tensor:
    """Float32 probabilities, as a learner answers; rounded to ``decimals`` for ties between examples."""
    p = torch.softmax(2 * torch.randn(n, classes, generator=gen), 1)
    return p if decimals is None else (p * 10**decimals).round() / 10**decimals


THREE_CLASSES = Target("multiclass", 3)
THRESHOLDED = Target("binary", 2, positive=0, threshold=0.3)


@pytest.mark.parametrize(
    ("name", "target", "n", "rare", "decimals"),
    [
        ("precision", FRAUD, 90, 12, None),
        ("pr_auc", FRAUD, 90, 12, None),
        # Ties in the scores, and so few positives that many resamples hold none (PR-AUC undefined).
        ("pr_auc", FRAUD, 40, 2, 1),
        ("balanced_error", THRESHOLDED, 90, 12, None),
        # A rare class that many resamples miss: their mean runs over the classes present.
        ("balanced_error", THREE_CLASSES, 60, 2, None),
    ],
)
def test_the_batched_bootstrap_gives_the_p_value_of_one_resample_at_a_time(
    monkeypatch, name, target, n, rare, decimals
):
    """The same seed gives the same resamples, batched (here 7 a batch, the last one short) or one at a time,
    and each batched measure the value measure() gives: the p-values agree exactly, both ways round."""
    monkeypatch.setattr(guard_module, "BOOTSTRAP_RESAMPLES", 200)
    monkeypatch.setattr(paired_tests, "BOOTSTRAP_CELLS", 7 * n)
    gen = torch.Generator().manual_seed(17)
    if target.kind == "binary":
        y = torch.full((n,), 1 - target.positive)
        y[:rare] = target.positive
    else:
        y = torch.randint(1, target.num_classes, (n,), generator=gen)
        y[:rare] = 0
    candidate, live = (random_probabilities(n, target.num_classes, gen, decimals) for _ in range(2))
    measure = build_measure(name, target)
    guard = PromotionGuard(alpha=0.05, positive_recall=False, seed=3)
    verdict = guard.judge(measure, candidate, live, y, n)
    assert verdict.headline.test.name == "bootstrap"
    assert verdict.headline.test.p_value == loop_bootstrap(measure, candidate, live, y, 200, seed=3)
    # The other way round: the test the guard runs on the candidate's own examples.
    reverse = guard._bootstrap(measure, candidate, live, y, against_candidate=False)
    assert reverse.p_value == loop_bootstrap(measure, live, candidate, y, 200, seed=3)


def test_the_resamples_are_the_indexes_drawn_one_resample_at_a_time(monkeypatch):
    monkeypatch.setattr(paired_tests, "BOOTSTRAP_CELLS", 3 * 11)
    batches = list(resample_counts(11, 8, seed=5))
    assert [len(b) for b in batches] == [3, 3, 2]
    generator = torch.Generator().manual_seed(5)
    drawn = [torch.randint(0, 11, (11,), generator=generator) for _ in range(8)]
    expected = torch.stack([torch.bincount(d, minlength=11) for d in drawn]).double()
    assert torch.equal(torch.cat(batches), expected)


def resample_case(kind: str, n: int, gen: torch.Generator) -> tuple[Target, torch.Tensor, torch.Tensor]:
    """A target of ``kind``, outputs and labels for it."""
    if kind == "regression":
        y = torch.randn(n, generator=gen, dtype=torch.float64)
        return Target("regression"), y + torch.randn(n, generator=gen, dtype=torch.float64), y
    target = FRAUD if kind == "binary" else THREE_CLASSES
    y = torch.randint(0, target.num_classes, (n,), generator=gen)
    return target, random_probabilities(n, target.num_classes, gen, decimals=1), y


@pytest.mark.parametrize(
    ("name", "kind"),
    [(name, kind) for name, cls in sorted(MEASURES.items()) for kind in cls.kinds if kind != "language_model"],
)
def test_every_measure_on_resamples_is_its_measure_of_each_resample(name, kind):
    gen = torch.Generator().manual_seed(23)
    target, outputs, y = resample_case(kind, 50, gen)
    measure = build_measure(name, target)
    counts = torch.cat(list(resample_counts(50, 30, seed=1)))
    examples = torch.arange(50)
    expected = []
    for row in counts:
        drawn = examples.repeat_interleave(row.long())
        expected.append(measure.measure(outputs[drawn], y[drawn]).value)
    # Exact but for PR-AUC, whose batched sum adds its terms in another order (paired_tests.TIE).
    tolerance = 1e-12 if name == "pr_auc" else 0.0
    torch.testing.assert_close(
        measure.on_resamples(outputs, y, counts),
        torch.tensor(expected, dtype=torch.float64),
        rtol=tolerance,
        atol=tolerance,
        equal_nan=True,
    )


def test_a_monte_carlo_sign_flip_draws_the_signs_it_drew_as_floats(monkeypatch):
    """The sign patterns are drawn as int32 now: the generator gives the same numbers, so the p-value is
    the one of the float64 patterns drawn before."""
    monkeypatch.setattr(paired_tests, "EXACT_CELLS", 0)
    gen = torch.Generator().manual_seed(13)
    differences = torch.randn(300, generator=gen, dtype=torch.float64) + 0.05
    sizes = differences.abs()
    generator = torch.Generator().manual_seed(4)
    reached = 0
    for start in range(0, 2500, paired_tests.FLIP_BATCH):
        rows = min(paired_tests.FLIP_BATCH, 2500 - start)
        positive = torch.randint(0, 2, (rows, 300), generator=generator, dtype=torch.float64)
        sums = 2 * (positive @ sizes) - sizes.sum()
        reached += int((sums >= float(differences.sum()) - 1e-9 * float(sizes.sum())).sum())
    assert sign_flip_test(differences, flips=2500, seed=4).p_value == (1 + reached) / 2501


def test_the_docs_snippet_runs_and_prints_what_the_docs_say():
    """docs/measures.md, "Using the measures and the guard from Python": its code, and what it prints."""
    text = Path(__file__).resolve().parents[1].joinpath("docs", "measures.md").read_text()
    section = text.split("## Using the measures and the guard from Python", 1)[1]
    code, printed = re.findall(r"```(?:python|text)\n(.*?)```", section, flags=re.DOTALL)[:2]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/measures.md", "exec"), {"__name__": "docs_snippet"})
    assert out.getvalue() == printed


# -- the guard's keys and the publisher --------------------------------------------------------------
def test_the_guard_reads_its_keys_from_the_serving_section(tmp_path):
    defaults = ServingConfig()
    assert PromotionGuard() == PromotionGuard(
        defaults.promotion_margin,
        defaults.promotion_alpha,
        defaults.promotion_min_examples,
        defaults.promotion_min_positives,
        defaults.guard_positive_recall,
    )
    config = build_config(
        {
            "daemon": {"checkpoint_dir": str(tmp_path)},
            "serving": {
                "promotion_margin": 0.02,
                "promotion_alpha": 0.05,
                "promotion_min_examples": 40,
                "promotion_min_positives": 10,
                "guard_positive_recall": False,
            },
        }
    )
    publisher = make_publisher(config)
    assert publisher is not None and publisher.promotion == PromotionGuard(0.02, 0.05, 40, 10, False)
    for key, value in (
        ("promotion_alpha", 0),
        ("promotion_alpha", 1.5),
        ("promotion_min_examples", 0),
        ("promotion_min_positives", -1),
        ("guard_positive_recall", "often"),
    ):
        with pytest.raises(ConfigError, match=key):
            build_config({"serving": {key: value}})


def test_a_refusal_is_one_line_naming_the_sample_size_and_the_test(tmp_path, good_and_bad, caplog):
    good, bad, sample = good_and_bad
    store = CheckpointStore(tmp_path, "alma")
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    publisher = LocalPublisher(store, promotion_margin=0.01)
    publisher.publish(1)
    with caplog.at_level(logging.WARNING, logger="serving.publishing.publisher"):
        outcome = publisher.publish(2)
    assert outcome.action == "refused" and outcome.examples == len(sample)
    (record,) = [r for r in caplog.records if r.name == "serving.publishing.publisher"]
    message = record.getMessage()
    assert "\n" not in message
    assert message.startswith("version 2 not promoted, version 1 stays live: on 200 examples, error ")
    assert "worse by more than promotion_margin 0.01 (McNemar p = " in message
    assert "< promotion_alpha 0.001; worse on" in message and outcome.reason in message
    assert (record.worse_on, record.better_on, record.examples) == (outcome.worse_on, outcome.better_on, 200)
    assert not hasattr(record, "reason")  # the message says it


FRAUD_TASK = TaskInfo("classification", (28, 28), 2, mean=(0.1307,), std=(0.3081,), classes=("ok", "fraud"))


@pytest.fixture(scope="module")
def fraud_versions() -> tuple[Learner, Learner, LabeledData]:
    """A version that finds the frauds, one that never flags one, and examples with 2 % fraud: the
    candidate's own 12 (no fraud), then 25 blocks of 60 holding one fraud each, then 5 more frauds."""
    finds = new_learner(task=FRAUD_TASK, seed=0)
    finds.fit(separable_data(FRAUD_TASK, 600, seed=1), separable_data(FRAUD_TASK, 100, seed=2), quick_trainer())
    never = new_learner(task=FRAUD_TASK, seed=1)
    last = never.model.layers[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([5.0, -5.0]))
    pool = separable_data(FRAUD_TASK, 4000, seed=3)
    frauds = torch.nonzero(pool.y == 1).squeeze(1)[:30]
    ok = torch.nonzero(pool.y == 0).squeeze(1)[: 12 + 59 * 25]
    blocks = [torch.cat([frauds[i : i + 1], ok[12 + 59 * i : 12 + 59 * (i + 1)]]) for i in range(25)]
    examples = pool.subset(torch.cat([ok[:12], *blocks, frauds[25:]]))
    found = finds.outputs(examples).argmax(1) == 1
    assert int(found[examples.y == 1].sum()) >= 25, "fixture: the first version finds the frauds"
    return finds, never, examples


def fraud_store(folder, finds: Learner, never: Learner, examples: LabeledData, earlier: int) -> CheckpointStore:
    """Versions that find frauds, saved with the last ``earlier`` blocks of 60 examples, oldest first (the
    first block with the 5 frauds left over); then a version that never flags one, with the own 12."""
    store = CheckpointStore(folder, "alma")
    for version, block in enumerate(range(25 - earlier, 25), start=1):
        sample = examples.subset(torch.arange(12 + 60 * block, 12 + 60 * (block + 1)))
        if block == 0:
            sample = LabeledData.concat([sample, examples.subset(torch.arange(1512, 1517))])
        save_version(store, version, finds, sample)
    save_version(store, earlier + 1, never, examples.subset(torch.arange(12)))
    return store


def test_the_issues_candidate_is_refused_once_the_sample_is_topped_up_to_thirty_frauds(
    tmp_path, fraud_versions, caplog
):
    finds, never, examples = fraud_versions
    store = fraud_store(tmp_path, finds, never, examples, earlier=25)
    # 300 examples alone hold 5 frauds: the candidate is promoted, as in the issue.
    without = LocalPublisher(store, promotion_margin=0.01, promotion_min_positives=0)
    assert int(without.guard_sample(without.load_candidate(26)).y.sum()) == 5
    assert without.guard(without.load_candidate(26), 25).action == "promoted"
    publisher = LocalPublisher(store, promotion_margin=0.01)
    sample = publisher.guard_sample(publisher.load_candidate(26))
    assert int(sample.y.sum()) == 30 and len(sample) == 12 + 60 * 25 + 5
    publisher.publish(25)
    with caplog.at_level(logging.WARNING, logger="serving.publishing.publisher"):
        outcome = publisher.publish(26)
    assert outcome.action == "refused" and outcome.positives == 30
    (record,) = [r for r in caplog.records if r.name == "serving.publishing.publisher"]
    assert "recall of fraud 0.00 against the live version's" in record.getMessage()
    assert "on the 30 fraud examples: it misses" in record.getMessage()


def test_fewer_positives_than_wanted_are_said_and_do_not_block_promotion(tmp_path, fraud_versions):
    finds, _, examples = fraud_versions
    publisher = LocalPublisher(fraud_store(tmp_path, finds, finds, examples, earlier=4), promotion_margin=0.01)
    publisher.publish(4)
    outcome = publisher.publish(5)
    assert outcome.action == "promoted" and outcome.positives == 4 and outcome.examples == 12 + 60 * 4
    assert outcome.reason.endswith("the sample held 4 fraud examples, fewer than promotion_min_positives 30")


def test_the_top_up_for_positives_stops_at_twenty_times_min_examples(tmp_path, fraud_versions):
    finds, _, examples = fraud_versions
    store = CheckpointStore(tmp_path, "alma")
    ok = examples.subset(torch.nonzero(examples.y == 0).squeeze(1))
    for version in range(1, 31):
        save_version(store, version, finds, ok.subset(torch.arange(10 * (version - 1), 10 * version)))
    publisher = LocalPublisher(store, promotion_margin=0.01, promotion_min_examples=5)
    sample = publisher.guard_sample(publisher.load_candidate(30))
    assert len(sample) == 20 * 5 and int(sample.y.sum()) == 0
