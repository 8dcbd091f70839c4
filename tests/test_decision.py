"""A binary task's decision: calibration, the threshold its task.decision asks for, and the measures and
served answers that read it."""

from __future__ import annotations

import math

import pytest
import torch

from alma_daemon.measures import Target, build_measure
from alma_daemon.measures.decision import (
    calibrated,
    choose_threshold,
    fit_calibration,
    log_odds,
    prior_calibration,
)


def probabilities(p_positive: torch.Tensor) -> torch.Tensor:
    return torch.stack([1 - p_positive, p_positive], dim=1)


def test_a_threshold_decides_the_positive_class_and_every_measure_reads_it():
    outputs = probabilities(torch.tensor([0.9, 0.3, 0.05, 0.02]))
    y = torch.tensor([1, 1, 0, 0])
    argmax = Target("binary", 2, positive=1, false_negative_cost=50.0)
    low = Target("binary", 2, positive=1, false_negative_cost=50.0, threshold=0.04)
    assert argmax.decide(outputs).tolist() == [1, 0, 0, 0]
    assert low.decide(outputs).tolist() == [1, 1, 1, 0]
    assert build_measure("recall", argmax).measure(outputs, y).value == 0.5
    assert build_measure("recall", low).measure(outputs, y).value == 1.0
    assert build_measure("cost", argmax).measure(outputs, y).value == pytest.approx(50 / 4)
    assert build_measure("cost", low).measure(outputs, y).value == pytest.approx(1 / 4)
    assert build_measure("error", low).measure(outputs, y).value == pytest.approx(1 / 4)
    # A multiclass target reads no threshold.
    three = Target("multiclass", 3, threshold=0.1)
    assert three.decide(torch.tensor([[0.2, 0.5, 0.3]])).tolist() == [1]


def test_the_prior_calibration_undoes_the_class_weights_odds():
    slope, intercept = prior_calibration((1.0, 50.0), positive=1)
    assert slope == 1.0 and intercept == pytest.approx(-math.log(50))
    # A network trained with weights 1:50 that says 0.5 means odds of 1:50.
    p = calibrated(probabilities(torch.tensor([0.5], dtype=torch.float64)), (slope, intercept), 1)
    assert float(p[0, 1]) == pytest.approx(1 / 51)
    assert prior_calibration((), 1) == (1.0, 0.0)


def test_platts_scaling_recovers_a_known_miscalibration():
    g = torch.Generator().manual_seed(0)
    true_logit = torch.randn(20_000, generator=g, dtype=torch.float64) * 2 - 3
    positives = torch.rand(20_000, generator=g, dtype=torch.float64) < torch.sigmoid(true_logit)
    # The network's probabilities: log-odds twice too confident, shifted by 1.
    raw = probabilities(torch.sigmoid(2 * true_logit + 1))
    slope, intercept = fit_calibration(raw, positives, torch.ones(20_000), 1, (1.0, 0.0))
    assert slope == pytest.approx(0.5, abs=0.03) and intercept == pytest.approx(-0.5, abs=0.08)
    assert fit_calibration(raw[:50], positives[:50], torch.ones(50), 1, (1.0, 0.0)) is None  # too few positives
    # A pool the network separates perfectly (11 positives at 0.999, 1,989 negatives at 0.001) keeps a finite,
    # moderate fit: the positives are not all certain, so neither is the calibrated probability.
    separated = probabilities(torch.cat([torch.full((11,), 0.999), torch.full((1_989,), 0.001)]).double())
    labels = torch.arange(2_000) < 11
    slope, intercept = fit_calibration(separated, labels, torch.ones(2_000), 1, (1.0, 0.0))
    p = calibrated(separated, (slope, intercept), 1)[:, 1]
    assert 0.5 < slope < 3 and 0.8 < float(p[0]) < 0.99 and 1e-5 < float(p[-1]) < 1e-3
    assert torch.allclose(log_odds(torch.tensor([0.5, 1.0])), torch.tensor([0.0, 30.0], dtype=torch.float64))


def test_the_threshold_of_each_decision():
    p = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2], dtype=torch.float64)
    y = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0]).bool()
    ones = torch.ones(8)

    def choose(decision: str, target: float | None = None):
        return choose_threshold(decision, target, p, y, ones, false_negative_cost=50.0, false_positive_cost=1.0)

    assert choose("cost").threshold == pytest.approx(1 / 51)
    assert choose("threshold", 0.33).threshold == 0.33
    recall = choose("recall", 0.75)  # 3 of the 4 positives: from 0.6 on
    assert recall.threshold == 0.6 and recall.met and recall.reached == 0.75
    precision = choose("precision", 0.75)  # 3 flagged of 4 are positives at 0.6, the lowest such threshold
    assert precision.threshold == 0.6 and precision.met
    unmet = choose("precision", 0.99)  # only the top example is sure: 1.0 at 0.9 (met), so ask more of it
    assert unmet.met and unmet.threshold == 0.8
    impossible = choose_threshold("precision", 0.99, p, ~y, ones, 50.0, 1.0)
    assert not impossible.met and impossible.reached is not None and impossible.reached < 0.99
