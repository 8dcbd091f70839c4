"""Skewed features through a Yeo-Johnson transform (alma_daemon/data/yeo_johnson.py): fitted on the first
chunk, saved in the task's spec, applied alike by training and by a model rebuilt from the spec."""

from __future__ import annotations

import math

import pytest
import torch

from alma_daemon.config import ConfigError, load_config
from alma_daemon.data import yeo_johnson
from alma_daemon.data.task_info import TaskInfo
from alma_daemon.data.task_terms import configured_task
from alma_daemon.models.backbones import Normalize


def features(rows: int = 4000, seed: int = 0) -> torch.Tensor:
    """A log-normal amount, an exponential distance, a negated log-normal, and two normal features."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 5, generator=g, dtype=torch.float64)
    x[:, 0] = torch.exp(3.5 + 1.1 * x[:, 0])
    x[:, 1] = -20.0 * torch.rand(rows, generator=g, dtype=torch.float64).log()
    x[:, 2] = -torch.exp(0.5 * x[:, 2])
    return x


def standardizing(skewed: str = "power") -> TaskInfo:
    return TaskInfo("classification", (5,), 2, normalization="standardize", skewed_features=skewed)


def test_the_transform_is_the_published_formula_on_both_sides_of_zero() -> None:
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    for lam in (-1.5, 0.0, 0.5, 1.0, 2.0):
        expected = [
            (math.log1p(v) if lam == 0 else ((v + 1) ** lam - 1) / lam)
            if v >= 0
            else (-math.log1p(-v) if lam == 2 else -(((1 - v) ** (2 - lam)) - 1) / (2 - lam))
            for v in x.tolist()
        ]
        got = yeo_johnson.transform(x, torch.tensor(lam, dtype=torch.float64))
        assert got.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12), lam
    assert torch.equal(yeo_johnson.transform(x, torch.tensor(1.0, dtype=torch.float64)), x)


def test_only_skewed_features_get_a_lambda_and_a_log_normal_gets_one_near_zero() -> None:
    lambdas = yeo_johnson.fit_lambdas(features())
    assert lambdas[3:] == (1.0, 1.0)  # normal features pass as they are
    assert abs(lambdas[0]) < 0.15  # a log-normal amount: close to log(1 + x)
    assert lambdas[1] < 0.6 and lambdas[2] > 1.4  # a right tail pulled in; a left tail (negatives) too
    assert yeo_johnson.fit_lambdas(torch.randn(2000, 3, dtype=torch.float64)) == ()
    assert yeo_johnson.fit_lambdas(torch.ones(100, 2, dtype=torch.float64)) == ()  # constant: not skewed


def test_the_transformed_features_are_near_symmetric_and_standardized() -> None:
    x = features()
    task = standardizing().with_statistics(x)
    z = Normalize(task)(x.float())
    centred = z.double() - z.double().mean(0)
    skewness = centred.pow(3).mean(0) / centred.pow(2).mean(0).pow(1.5)
    # Every feature ends under the threshold that picked it (the left tail's lambda stops at the grid's 2).
    assert skewness.abs().max() < yeo_johnson.SKEWNESS, skewness
    assert z.mean(0).abs().max() < 1e-4 and (z.std(0) - 1).abs().max() < 1e-3


def test_keep_and_a_task_without_skewed_features_store_no_power() -> None:
    x = features()
    assert standardizing("keep").with_statistics(x).power == ()
    plain = standardizing().with_statistics(torch.randn(500, 5))
    assert plain.power == () and "power" not in plain.to_dict()


def test_a_model_rebuilt_from_the_spec_transforms_alike_and_huge_inputs_stay_finite() -> None:
    x = features()
    task = standardizing().with_statistics(x)
    restored = TaskInfo.from_dict(task.to_dict())
    assert restored == task and restored.power == task.power
    batch = x[:64].float()
    assert torch.equal(Normalize(task)(batch), Normalize(restored)(batch))
    # standardize_ (in place, the training loop's) gives the floats standardize gives.
    assert torch.equal(Normalize(task).standardize_(batch.clone()), Normalize(task).standardize(batch))
    hostile = torch.tensor([[1e30, -1e30, -1e30, 0.0, 0.0], [3e38, 1e30, 1e30, 0.0, 0.0]])
    assert torch.isfinite(Normalize(task)(hostile)).all()


def test_the_config_sets_it_and_given_statistics_are_taken_as_they_are(tmp_path) -> None:
    table = TaskInfo("classification", (5,), 2, normalization="standardize")
    power = configured_task(
        table, load_config(None, ["dataset.name=table", "dataset.files=[x.csv]", "dataset.label_column=y"])
    )
    assert power.skewed_features == "power"
    keep = ["dataset.name=table", "dataset.files=[x.csv]", "dataset.label_column=y", "dataset.skewed_features=keep"]
    assert configured_task(table, load_config(None, keep)).skewed_features == "keep"
    given = [
        "dataset.name=table",
        "dataset.files=[x.csv]",
        "dataset.label_column=y",
        "task.feature_mean=[0,0,0,0,0]",
        "task.feature_std=[1,1,1,1,1]",
    ]
    team = configured_task(table, load_config(None, given))
    assert team.skewed_features == "keep" and team.mean == (0.0,) * 5
    with pytest.raises(ConfigError, match="dataset.skewed_features"):
        load_config(None, ["dataset.skewed_features=log"])
