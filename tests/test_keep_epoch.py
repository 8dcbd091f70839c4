"""``train.keep_epoch``: a stage keeps its best epoch on the validation set (the paper's rule) or, for a team's
task, its last epoch unless an earlier one validated better by more than the last one's standard error
(alma_daemon/training/loop.py, ``EarlyStopping``)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

from alma_daemon.config import ConfigError, TrainConfig, build_config
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.research.simulate import run_simulation
from alma_daemon.training.data_parallel import mean_of_slices
from alma_daemon.training.loop import EarlyStopping, Trainer
from alma_daemon.training.losses import task_loss
from alma_daemon.training.validated import Validated, binomial, mean_with_error
from tests.helpers.configs import sea_stream_config

BINARY = TaskInfo("classification", (6,), 2, normalization="none")


def epoch_values(*values: float | Validated) -> list[float | Validated]:
    return list(values)


def kept_epoch(keep: str, values: list[float | Validated], patience: int = 10) -> tuple[int, float]:
    """The epoch and value ``EarlyStopping`` leaves after epochs measured ``values`` (fewer where ``patience``
    stops it), and a check that the network holds that epoch's weights."""
    net = nn.Linear(1, 1, bias=False)
    stopping = EarlyStopping(patience=patience, keep=keep)
    for epoch, value in enumerate(values, start=1):
        nn.init.constant_(net.weight, float(epoch))  # the weights say which epoch they are
        if stopping.update(value, epoch, net):
            break
    stopping.restore(net)
    assert net.weight.item() == stopping.best_epoch
    return stopping.best_epoch, stopping.best_error


def test_the_paper_keeps_its_best_epoch_however_close_the_last_came() -> None:
    values = epoch_values(Validated(0.10, 0.05), Validated(0.12, 0.05), Validated(0.11, 0.05))
    assert kept_epoch("best", values) == (1, 0.10)


def test_a_last_epoch_within_its_standard_error_of_the_best_is_kept() -> None:
    values = epoch_values(Validated(0.10, 0.05), Validated(0.12, 0.05), Validated(0.14, 0.05))
    assert kept_epoch("last_unless_beaten", values) == (3, 0.14)


def test_a_last_epoch_beaten_by_more_than_its_standard_error_gives_way_to_the_best() -> None:
    values = epoch_values(Validated(0.10, 0.01), Validated(0.12, 0.01), Validated(0.14, 0.01))
    assert kept_epoch("last_unless_beaten", values) == (1, 0.10)


def test_a_stage_patience_stopped_restores_its_best_however_close_the_last_came() -> None:
    # Two epochs without improvement past patience 1: what followed the best taught nothing visible.
    values = epoch_values(Validated(0.10, 0.05), Validated(0.12, 0.05), Validated(0.11, 0.05), Validated(0.1, 0.05))
    assert kept_epoch("last_unless_beaten", values, patience=1) == (1, 0.10)
    assert kept_epoch("last_unless_beaten", values[:3], patience=2) == (3, 0.11)  # ran out of epochs first


def test_a_measure_without_a_standard_error_keeps_the_best_under_either_rule() -> None:
    # PR-AUC is no mean over examples: no standard error, so nothing tells luck from a better epoch.
    values = epoch_values(0.30, 0.31, 0.32)
    assert kept_epoch("last_unless_beaten", values) == (1, 0.30)
    assert kept_epoch("last_unless_beaten", epoch_values(0.32, 0.31, 0.30)) == (3, 0.30)


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="keep epoch 'first'"):
        EarlyStopping(patience=1, keep="first")


def test_the_standard_errors_are_the_textbook_ones() -> None:
    losses = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    equal = mean_with_error(losses, torch.ones(5))
    assert float(equal) == pytest.approx(0.6)
    assert equal.standard_error == pytest.approx(losses.double().std(unbiased=False).item() / math.sqrt(5))
    # An example of weight 0 is left out; weights w: sqrt(sum w^2 (l - mean)^2) / sum w.
    weighted = mean_with_error(torch.tensor([0.0, 1.0, 5.0]), torch.tensor([1.0, 3.0, 0.0]))
    assert float(weighted) == pytest.approx(0.75)
    assert weighted.standard_error == pytest.approx(math.sqrt(0.75**2 + 9 * 0.25**2) / 4)
    assert math.isnan(mean_with_error(torch.ones(2), torch.zeros(2)))
    # A record crosses processes (research/run_pool.py): the reduce protocol pickle and copy share.
    copied = copy.deepcopy(equal)
    assert (copied, copied.standard_error) == (equal, equal.standard_error)
    rate = binomial(20, 200)
    assert float(rate) == 0.1 and rate.standard_error == pytest.approx(math.sqrt(0.1 * 0.9 / 200))
    assert math.isnan(binomial(0, 0))


def test_slices_measured_on_their_ranks_combine_to_the_whole_sets_mean_and_standard_error() -> None:
    first, second = binomial(10, 100), binomial(30, 100)
    parts = [(first, 100), (second, 100)]
    total = sum(float(value) * n for value, n in parts)
    spread_squared = sum((value.standard_error * n) ** 2 for value, n in parts)
    combined = mean_of_slices(total, 200, spread_squared)
    assert float(combined) == pytest.approx(0.2)
    assert combined.standard_error == pytest.approx(math.sqrt(0.1 * 0.9 / 100 + 0.3 * 0.7 / 100) / 2)
    assert not isinstance(mean_of_slices(total, 200, math.nan), Validated)  # a slice without a standard error
    assert math.isnan(mean_of_slices(0.0, 0, 0.0))


def test_a_validation_value_carries_its_standard_error_where_the_measure_is_a_mean() -> None:
    g = torch.Generator().manual_seed(0)
    raw, y = torch.randn(80, 2, generator=g), torch.randint(0, 2, (80,), generator=g)
    for measure in ("error", "log_loss", "cost"):
        value = task_loss(dataclasses.replace(BINARY, measure=measure)).validation_value(raw, y)
        assert isinstance(value, Validated) and value.standard_error > 0, measure
    weighted = task_loss(dataclasses.replace(BINARY, class_weights=(1.0, 4.0))).validation_value(raw, y)
    assert weighted.standard_error != task_loss(BINARY).validation_value(raw, y).standard_error
    regression = TaskInfo("regression", (6,), 1, normalization="none", measure="mse")
    assert task_loss(regression).validation_value(torch.randn(50, 1, generator=g), torch.randn(50)).standard_error > 0
    pr_auc = task_loss(dataclasses.replace(BINARY, measure="pr_auc")).validation_value(raw, y)
    assert not isinstance(pr_auc, Validated)


def test_a_stage_keeps_the_epoch_its_rule_chooses() -> None:
    """Trainer.fit under each rule, on validation values that only its last epoch's standard error tells apart."""
    g = torch.Generator().manual_seed(0)
    data = LabeledData(torch.randn(64, 3, generator=g), torch.randint(0, 2, (64,), generator=g))
    config = TrainConfig(epochs=3, patience=5, batch_size=16, optimizer="sgd")

    def fit(keep: str, errors: list[float]) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
        net = nn.Linear(3, 2)
        seen: list[torch.Tensor] = []

        def validate(model: nn.Module, val: LabeledData, meter: object) -> float:
            seen.append(model.weight.detach().clone())
            return Validated(errors[len(seen) - 1], 0.05)

        report = Trainer(config, "sgd", torch.device("cpu"), seed=0, keep_epoch=keep).fit(
            net, data, data, validate=validate
        )
        return report.best_epoch, net.weight.detach(), seen

    epoch, weights, seen = fit("best", [0.10, 0.12, 0.14])
    assert epoch == 1 and torch.equal(weights, seen[0])
    epoch, weights, seen = fit("last_unless_beaten", [0.10, 0.12, 0.14])
    assert epoch == 3 and torch.equal(weights, seen[2])
    epoch, weights, seen = fit("last_unless_beaten", [0.10, 0.12, 0.30])
    assert epoch == 1 and torch.equal(weights, seen[0])


def test_the_rule_defaults_by_task_and_a_bad_one_fails_at_start_up() -> None:
    assert TrainConfig().epoch_kept(team_task=True) == "last_unless_beaten"
    assert TrainConfig().epoch_kept(team_task=False) == "best"
    assert TrainConfig(keep_epoch="best").epoch_kept(team_task=True) == "best"
    with pytest.raises(ConfigError, match="train.keep_epoch"):
        build_config({"train": {"keep_epoch": "luckiest"}})


def test_a_team_stream_keeps_later_epochs_than_the_best_rule_would() -> None:
    pytest.importorskip("river")
    series = {
        keep: run_simulation(sea_stream_config({"epochs": 4, "patience": 4, "keep_epoch": keep}), progress=False)[
            "series"
        ]
        for keep in ("best", None)
    }
    kept = {keep: [row["best_epoch"] for row in rows if row["trained"]] for keep, rows in series.items()}
    assert sum(kept[None]) > sum(kept["best"]), kept
