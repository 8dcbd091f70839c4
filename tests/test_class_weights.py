"""``task.class_weights`` weigh a classifier's training loss everywhere it is computed (the loop, stacked
members, gMoE's expert losses, Firefly's scores) and early stopping's validation value; without weights,
and judged by the error rate, training is the paper's, bit for bit. Early stopping reads the task's measure."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from alma_daemon.config import TrainConfig
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from alma_daemon.learners.firefly import trace
from alma_daemon.learners.gmoe import cumulative_losses
from alma_daemon.measures import task_measure
from alma_daemon.models.backbones import build_backbone
from alma_daemon.training.loop import Trainer
from alma_daemon.training.losses import task_loss
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data

BINARY = TaskInfo("classification", (6,), 2, normalization="none")
WEIGHTED = dataclasses.replace(BINARY, class_weights=(1.0, 4.0))


def logits_and_labels(n: int = 64, classes: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, classes, generator=g), torch.randint(0, classes, (n,), generator=g)


def imbalanced(n: int, seed: int) -> LabeledData:
    """One positive in eight, findable from the first feature (noisily)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.125).long()
    x = torch.randn(n, 6, generator=g)
    x[:, 0] += 1.5 * y
    return LabeledData(x, y)


def trainer(seed: int = 0) -> Trainer:
    return Trainer(TrainConfig(epochs=6, patience=2, batch_size=32), "adam", torch.device("cpu"), seed=seed)


def test_the_unweighted_loss_is_the_loops_cross_entropy_and_its_error_bit_for_bit():
    logits, y = logits_and_labels(classes=10)
    loss = task_loss(MNIST_TASK)
    assert loss.counts_errors
    assert torch.equal(loss.mean_loss(logits, y), F.cross_entropy(logits, y))
    stacked, labels = logits.view(2, 32, 10), y.view(2, 32)
    expected = F.cross_entropy(stacked.flatten(0, 1), labels.flatten(), reduction="none").view(2, 32).mean(1).sum()
    assert torch.equal(loss.stacked_loss(stacked, labels), expected)


def test_an_unweighted_learner_trains_as_the_loop_alone():
    train, val = separable_data(MNIST_TASK, 128, 1), separable_data(MNIST_TASK, 32, 2)
    learner = build_learner("sm", MNIST_TASK, learner_settings("sm", {"width": 8}), 0)
    net = build_backbone(MNIST_TASK, 8)
    net.load_state_dict(learner.model.state_dict())
    got, expected = learner.fit(train, val, trainer()), trainer().fit(net, train, val)
    assert (got.val_error, got.epochs, got.best_epoch) == (expected.val_error, expected.epochs, expected.best_epoch)
    assert all(torch.equal(a, b) for a, b in zip(learner.model.state_dict().values(), net.state_dict().values()))


def test_weights_weigh_each_examples_cross_entropy_and_the_mean_is_the_weighted_one():
    logits, y = logits_and_labels()
    loss = task_loss(WEIGHTED)
    w = torch.tensor([1.0, 4.0])
    plain = F.cross_entropy(logits, y, reduction="none")
    torch.testing.assert_close(loss.per_example(logits, y), plain * w[y])
    torch.testing.assert_close(loss.mean_loss(logits, y), (plain * w[y]).sum() / w[y].sum())
    assert not torch.allclose(loss.mean_loss(logits, y), plain.mean())
    stacked, labels = logits.view(2, 32, 2), y.view(2, 32)
    members = loss.mean_loss(stacked[0], labels[0]) + loss.mean_loss(stacked[1], labels[1])
    torch.testing.assert_close(loss.stacked_loss(stacked, labels), members)


def test_early_stopping_reads_the_class_weighted_error():
    # Predictions: class 1, 0, 1, 0 for labels 0, 0, 1, 1: one mistake of each class.
    raw = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([0, 0, 1, 1])
    assert task_loss(BINARY).validation_value(raw, y) == 0.5
    # Weighted 1 and 4: (1 + 4) / (2 * 1 + 2 * 4).
    assert task_loss(WEIGHTED).validation_value(raw, y) == pytest.approx(0.5)
    # Labels 0, 1, 0, 0: the positive and two negatives wrong; 3 / 4 unweighted, (1 + 4 + 1) / 7 weighted.
    y = torch.tensor([0, 1, 0, 0])
    assert task_loss(BINARY).validation_value(raw, y) == 0.75
    assert task_loss(WEIGHTED).validation_value(raw, y) == pytest.approx(6 / 7)


def test_early_stopping_reads_the_tasks_own_measure_but_for_one_sided_ones():
    raw, y = logits_and_labels(n=40)
    log_loss = dataclasses.replace(BINARY, measure="log_loss")
    loss = task_loss(log_loss)
    assert not loss.counts_errors
    assert loss.validation_value(raw, y) == pytest.approx(task_measure(log_loss).measure(raw.softmax(1), y).value)
    # A recall of 1 is one epoch of flagging everything away: recall stops on the balanced error.
    recall = task_loss(dataclasses.replace(BINARY, measure="recall"))
    balanced = task_measure(dataclasses.replace(BINARY, measure="balanced_error"))
    assert recall.validation_value(raw, y) == pytest.approx(balanced.measure(raw.softmax(1), y).value)


def test_a_measure_the_validation_set_leaves_undefined_is_no_improvement():
    raw = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    pr_auc = task_loss(dataclasses.replace(BINARY, measure="pr_auc"))
    assert pr_auc.validation_value(raw, torch.tensor([0, 0, 0, 0])) == math.inf  # no positive to rank
    assert pr_auc.validation_value(raw, torch.tensor([0, 1, 0, 0])) == 0.5  # ranked first, tied with a negative
    assert math.isnan(pr_auc.validation_value(raw[:0], torch.tensor([], dtype=torch.long)))  # no examples


def test_weights_change_what_a_learner_trains():
    train, val = imbalanced(256, 1), imbalanced(64, 2)
    states = {}
    for task in (BINARY, WEIGHTED):
        learner = build_learner("ens", task, learner_settings("ens", {"width": 8, "members": 2}), 0)
        learner.fit(train, val, trainer())
        states[task.class_weights] = learner.model.state_dict()
    assert any(not torch.equal(a, states[()][k]) for k, a in states[(1.0, 4.0)].items())


def test_gmoe_splits_by_the_weighted_losses():
    data = imbalanced(64, 3)
    learner = build_learner("gmoe", BINARY, learner_settings("gmoe", {"width": 8}), 0)
    doubled = dataclasses.replace(BINARY, class_weights=(2.0, 2.0))
    plain = cumulative_losses(learner.model, data, task_loss(BINARY))
    weighted = cumulative_losses(learner.model, data, task_loss(doubled))
    assert all(torch.equal(w, 2 * p) for w, p in zip(weighted, plain))


def test_firefly_scores_candidates_on_the_weighted_loss():
    data = imbalanced(64, 4)
    learner = build_learner("firefly", WEIGHTED, learner_settings("firefly", {"width": 8}), 0)
    _, loss = trace(learner.model, data.x, data.y, learner.training_loss)
    learner.model.eval()
    with torch.no_grad():
        expected = F.cross_entropy(learner.model(data.x), data.y, weight=torch.tensor([1.0, 4.0]))
    assert loss == pytest.approx(float(expected), rel=1e-6)
