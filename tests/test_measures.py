"""The task measures (alma_daemon/measures): one contract every measure passes, and each one's values."""

from __future__ import annotations

import math

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.measures import MEASURES, Target, build_measure
from alma_daemon.measures.binary import average_precision

FRAUD = Target("binary", 2, ("ok", "fraud"), positive=1, false_negative_cost=10.0, false_positive_cost=1.0)
DIGITS = Target("multiclass", 3, ("a", "b", "c"))
AMOUNT = Target("regression", 1)
TARGET_OF_KIND = {"binary": FRAUD, "multiclass": DIGITS, "regression": AMOUNT}


def outputs_for(target: Target, n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's outputs and the labels: a noisy classifier (probabilities) or a noisy regression."""
    gen = torch.Generator().manual_seed(seed)
    if target.kind == "regression":
        y = torch.randn(n, generator=gen) * 3 + 5
        return y + torch.randn(n, generator=gen), y
    weights = torch.tensor([0.9, 0.1]) if target.kind == "binary" else torch.ones(target.num_classes)
    y = torch.multinomial(weights, n, replacement=True, generator=gen)
    logits = torch.randn(n, target.num_classes, generator=gen) + 2.5 * torch.nn.functional.one_hot(
        y, target.num_classes
    )
    return logits.softmax(1), y


CASES = [(name, kind) for name, cls in MEASURES.items() for kind in cls.kinds if kind != "language_model"]


@pytest.mark.parametrize("name,kind", CASES)
def test_every_measure_is_a_mean_of_its_per_example_losses_or_says_it_is_not(name, kind):
    measure = build_measure(name, TARGET_OF_KIND[kind])
    outputs, y = outputs_for(measure.target)
    measured = measure.measure(outputs, y)
    assert math.isfinite(measured.value) and measured.examples > 0
    terms = measure.per_example(outputs, y)
    if terms is None:
        assert name in ("precision", "pr_auc", "balanced_error")
        return
    losses, counted = terms
    assert losses.shape == counted.shape == y.shape
    assert float(losses[counted].mean()) == pytest.approx(measure.loss(measured.value))


@pytest.mark.parametrize("name,kind", CASES)
def test_a_model_that_learned_beats_the_input_blind_baseline(name, kind):
    measure = build_measure(name, TARGET_OF_KIND[kind])
    outputs, y = outputs_for(measure.target, n=2000)
    value, baseline = measure.measure(outputs, y).value, measure.baseline(y)
    assert measure.loss(value) < measure.loss(baseline)


@pytest.mark.parametrize("name,kind", CASES)
def test_a_measure_on_no_examples_is_nan_not_an_error(name, kind):
    measure = build_measure(name, TARGET_OF_KIND[kind])
    shape = (0,) if kind == "regression" else (0, measure.target.num_classes)
    assert math.isnan(measure.measure(torch.empty(shape), torch.empty(0, dtype=torch.long)).value)


def test_a_measure_that_does_not_fit_the_task_is_refused_naming_what_fits():
    with pytest.raises(ValueError, match="measure 'recall' does not fit a multiclass task; it takes balanced_error, "):
        build_measure("recall", DIGITS)
    with pytest.raises(ValueError, match="'mse' does not fit a binary task"):
        build_measure("mse", FRAUD)


def test_the_fraud_measures_count_what_a_fraud_team_counts():
    # 10 frauds among 100: the model catches 6, misses 4 and raises 3 false alarms.
    y = torch.tensor([1] * 10 + [0] * 90)
    predicted = torch.tensor([1] * 6 + [0] * 4 + [1] * 3 + [0] * 87)
    outputs = torch.nn.functional.one_hot(predicted, 2).double() * 0.8 + 0.1
    value = {name: build_measure(name, FRAUD).measure(outputs, y) for name in ("error", "recall", "precision", "cost")}
    assert value["error"].value == pytest.approx(7 / 100)
    assert (value["recall"].value, value["recall"].examples) == (pytest.approx(0.6), 10)
    assert (value["precision"].value, value["precision"].examples) == (pytest.approx(6 / 9), 9)
    assert value["cost"].value == pytest.approx((4 * 10 + 3 * 1) / 100)
    # "Always ok" has the lower error of the two, and the measures a fraud team reads say why it is useless.
    always_ok = torch.tensor([[0.9, 0.1]]).expand(100, -1)
    assert build_measure("error", FRAUD).measure(always_ok, y).value == pytest.approx(0.10)
    assert build_measure("recall", FRAUD).measure(always_ok, y).value == 0.0
    assert build_measure("precision", FRAUD).measure(always_ok, y).value == 0.0  # flags nothing: the worst
    assert build_measure("cost", FRAUD).measure(always_ok, y).value == pytest.approx(1.0)


def test_a_binary_tasks_details_show_the_other_measures_of_the_positive_class():
    outputs, y = outputs_for(FRAUD)
    details = build_measure("cost", FRAUD).details(outputs, y)
    assert list(details) == ["error", "recall", "precision", "pr_auc"]
    assert "error" not in build_measure("error", FRAUD).details(outputs, y)


def test_a_multiclass_tasks_details_give_each_class_its_recall_by_name():
    outputs, y = outputs_for(DIGITS)
    details = build_measure("balanced_error", DIGITS).details(outputs, y)
    assert set(details) == {"error", "recall[a]", "recall[b]", "recall[c]"}
    mean_recall = sum(details[f"recall[{c}]"] for c in "abc") / 3
    assert build_measure("balanced_error", DIGITS).measure(outputs, y).value == pytest.approx(1 - mean_recall)
    assert build_measure("error", DIGITS).details(outputs, y) == {}  # the paper's rows stay as they were


def test_average_precision_ranks_positives_and_ties_share_a_threshold():
    positives = torch.tensor([True, False, True, False])
    assert average_precision(torch.tensor([0.9, 0.8, 0.7, 0.1]), positives) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision(torch.full((4,), 0.5), positives) == pytest.approx(0.5)  # the positives' share
    assert math.isnan(average_precision(torch.rand(4), torch.zeros(4, dtype=torch.bool)))


def test_a_regressions_baselines_are_the_mean_and_the_median():
    y = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert build_measure("mse", AMOUNT).baseline(y) == pytest.approx(float(y.var(correction=0)))
    assert build_measure("mae", AMOUNT).baseline(y) == pytest.approx((1.5 + 0.5 + 0.5 + 7.5) / 4)


def test_a_rates_variance_is_binomial_and_a_mean_losss_is_its_spread():
    error, cost = build_measure("error", FRAUD), build_measure("cost", FRAUD)
    assert error.variance(0.1, 100, unit_variance=123.0) == pytest.approx(0.1 * 0.9 / 100)
    assert error.variance(0.0, 100, unit_variance=0.0) == pytest.approx(1 / 100 / 100)  # floored: 0 is not certain
    assert cost.variance(0.4, 100, unit_variance=2.5) == pytest.approx(2.5 / 100)


def test_the_task_section_names_a_term_that_does_not_fit():
    from alma_daemon.config import ConfigError
    from alma_daemon.data.datasets import MNIST_TASK
    from alma_daemon.data.task_terms import configured_task

    def configured(task_section: dict, task=MNIST_TASK):
        return configured_task(task, build_config({"task": task_section}))

    assert configured({}) == MNIST_TASK
    with pytest.raises(ConfigError, match=r"task.classes: 2 given for the task's 10 classes"):
        configured({"classes": ["ok", "fraud"]})
    with pytest.raises(ConfigError, match="task.positive_class: only a binary task has a positive class"):
        configured({"positive_class": "3"})
    with pytest.raises(ConfigError, match="task.feature_mean: the model standardizes no features"):
        configured({"feature_mean": [0.0] * 784, "feature_std": [1.0] * 784})
    with pytest.raises(ConfigError, match="task.false_negative_cost: costs are read only by task.measure: cost"):
        configured({"false_negative_cost": 5})
