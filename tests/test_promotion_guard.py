"""The promotion guard's decision (serving/guard.py): right about noise, never fooled by a truly worse version.

The versions here are mistake vectors drawn with seeded generators, so the rates are exact and
the tests deterministic; tests/test_serving_local.py guards real checkpoints through the publisher.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from alma_daemon.config import ConfigError, ServingConfig, build_config
from alma_daemon.core.checkpoints import CheckpointStore
from serving import make_publisher
from serving.guard import PromotionGuard, binomial_tail
from serving.local_publisher import LocalPublisher
from tests.helpers.serving import save_version


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
        refused += not guard.judge(candidate, live, own).promoted
    return refused / trials


def test_the_binomial_tail_is_exact():
    for n in range(0, 13):
        for k in range(-1, n + 2):
            expected = sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2**n
            assert binomial_tail(k, n) == pytest.approx(expected, abs=0)
    assert binomial_tail(10, 11) == 12 / 2048
    assert 0 < binomial_tail(400, 500) < 1e-40


def test_the_issues_noise_is_promoted_where_the_margin_alone_refused_it():
    """A 12-example sample: the candidate wrong on 5, the live version on 4 (0.4167 against 0.3333)."""
    live = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    candidate = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    verdict = PromotionGuard(margin=0.01).judge(candidate, live, own_examples=12)
    assert (verdict.candidate_error, verdict.live_error) == (5 / 12, 4 / 12)
    assert (verdict.worse_on, verdict.better_on, verdict.p_value) == (2, 1, 0.5)
    assert verdict.promoted
    # The guard before it (the margin alone) refused this: alpha 1 leaves only the margin.
    assert not PromotionGuard(margin=0.01, alpha=1.0).judge(candidate, live, own_examples=12).promoted


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
    assert PromotionGuard(margin=0.01, alpha=1.0).judge(candidate, live, 12).promoted
    candidate[:4] = True
    assert not PromotionGuard(margin=0.01, alpha=1.0).judge(candidate, live, 12).promoted


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
    verdict = PromotionGuard().judge(candidate, live, own_examples=12)
    assert verdict.promoted and verdict.newest_prefer_candidate
    assert verdict.p_value < 1e-50
    # Its own examples undecided (6 each way): the older ones decide, and refuse it.
    candidate[:6] = True
    live[:6] = False
    verdict = PromotionGuard().judge(candidate, live, own_examples=12)
    assert not verdict.promoted and not verdict.newest_prefer_candidate


def test_the_guard_needs_both_versions_mistakes_on_the_same_examples():
    with pytest.raises(ValueError, match="same examples"):
        PromotionGuard().judge(torch.zeros(3, dtype=torch.bool), torch.zeros(4, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match="alpha"):
        PromotionGuard(alpha=0.0)


def test_the_guard_reads_its_keys_from_the_serving_section(tmp_path):
    defaults = ServingConfig()
    assert PromotionGuard() == PromotionGuard(
        defaults.promotion_margin, defaults.promotion_alpha, defaults.promotion_min_examples
    )
    config = build_config(
        {
            "daemon": {"checkpoint_dir": str(tmp_path)},
            "serving": {"promotion_margin": 0.02, "promotion_alpha": 0.05, "promotion_min_examples": 40},
        }
    )
    publisher = make_publisher(config)
    assert publisher is not None and publisher.promotion == PromotionGuard(0.02, 0.05, 40)
    for key, value in (("promotion_alpha", 0), ("promotion_alpha", 1.5), ("promotion_min_examples", 0)):
        with pytest.raises(ConfigError, match=key):
            build_config({"serving": {key: value}})


def test_a_refusal_is_one_line_naming_the_sample_size_and_the_test(tmp_path, good_and_bad, caplog):
    good, bad, sample = good_and_bad
    store = CheckpointStore(tmp_path, "alma")
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    publisher = LocalPublisher(store, promotion_margin=0.01)
    publisher.publish(1)
    with caplog.at_level(logging.WARNING, logger="serving.publisher"):
        outcome = publisher.publish(2)
    assert outcome.action == "refused" and outcome.examples == len(sample)
    (record,) = [r for r in caplog.records if r.name == "serving.publisher"]
    message = record.getMessage()
    assert "\n" not in message
    assert message.startswith("version 2 not promoted, version 1 stays live: a paired test on 200 validation examples")
    assert "promotion_margin 0.01" in message and "promotion_alpha 0.001" in message
    assert (record.worse_on, record.better_on, record.examples) == (outcome.worse_on, outcome.better_on, 200)
