"""A regression (a float target): every image-backbone learner fits it on the task's loss, answers numbers
in the target's units, early-stops on the task's measure, and grows on the regression's loss; language
models refuse it when built."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from alma_daemon.config import ConfigError, DatasetConfig, TaskConfig, TrainConfig, build_config
from alma_daemon.data.arrays import load_npz
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.declared_task import REGRESSION_MEASURES, arrays_task
from alma_daemon.data.stream_task import load_stream_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner, learner_from_spec
from alma_daemon.measures import MEASURES
from alma_daemon.training.loop import Trainer
from alma_daemon.training.losses import RegressionLoss, task_loss
from alma_daemon.training.members import fit_stacked
from tests.helpers.configs import learner_settings
from tests.helpers.contract import FEATURES, TOKENS, linear_data

#: What each learner is built with: small, so a fit takes a second.
SETTINGS = {"width": 16, "members": 2}
LEARNERS = ["sm", "ens", "umix", "gens", "gmoe", "firefly"]


def trainer(stage: int = 1, **train: int) -> Trainer:
    config = TrainConfig(**{"epochs": 10, "patience": 3, "batch_size": 32, **train})
    return Trainer(config, "adam", torch.device("cpu"), seed=stage)


def regression_learner(name: str, task: TaskInfo = FEATURES, **overrides):
    return build_learner(name, task, learner_settings(name, SETTINGS, overrides), 0)


@pytest.mark.parametrize("name", LEARNERS)
def test_a_learner_fits_a_linear_target_and_answers_one_number_per_example(name):
    train, val = linear_data(400, 1), linear_data(100, 2)
    learner = regression_learner(name)
    learner.take_statistics(train)
    assert learner.task.target_mean == pytest.approx(float(train.y.double().mean()))
    # Standardized, an untrained network answers about the target's mean: an error of about its variance.
    before = learner.measure_on(val).value
    assert before < 2 * float(val.y.var())
    learner.fit(train, val, trainer(1))
    if learner.grows:
        growth = learner.grow(val, trainer(2))
        learner.architecture_changed()
        assert growth.grew, growth
        learner.fit(train, val, trainer(3))
    outputs = learner.outputs(val)
    assert outputs.shape == (len(val),) and outputs.dtype == torch.float32
    assert torch.equal(learner.predict_outputs(val.x), outputs)
    after = learner.measure_on(val).value
    assert learner.measure == "mse" and after < 0.25 * before, (before, after)
    assert learner.inference_flops_per_example() > 0


def test_early_stopping_reads_the_tasks_measure_in_the_targets_units():
    train, val = linear_data(300, 1), linear_data(100, 2)
    for measure in ("mse", "mae"):
        learner = regression_learner("sm", dataclasses.replace(FEATURES, measure=measure))
        learner.take_statistics(train)
        report = learner.fit(train, val, trainer())
        assert learner.measure == measure
        assert report.val_error == pytest.approx(learner.measure_on(val).value, rel=1e-5)


def test_mse_trains_on_the_squared_error_and_mae_on_the_absolute_error_of_the_standardized_target():
    task = dataclasses.replace(FEATURES, target_mean=10.0, target_std=4.0)
    raw, y = torch.tensor([[1.0], [-0.5]]), torch.tensor([18.0, 10.0])
    # Standardized targets 2 and 0: errors -1 and -0.5.
    assert float(task_loss(task).mean_loss(raw, y)) == pytest.approx((1 + 0.25) / 2)
    assert float(task_loss(dataclasses.replace(task, measure="mae")).mean_loss(raw, y)) == pytest.approx(0.75)
    assert torch.equal(task_loss(task).answers(raw), torch.tensor([14.0, 8.0]))


def test_the_loss_follows_every_regression_measure():
    regression_measures = {name for name, cls in MEASURES.items() if "regression" in cls.kinds}
    for name in regression_measures:
        assert isinstance(task_loss(dataclasses.replace(FEATURES, measure=name)), RegressionLoss)


def test_stacked_members_train_as_each_alone_on_a_regression():
    train, val = linear_data(200, 1), linear_data(60, 2)
    task = FEATURES.with_statistics(train.x).with_target_statistics(train.y)
    stacked, alone = (regression_learner("ens", task).model for _ in range(2))
    loss = task_loss(task)
    reports = fit_stacked(trainer(patience=0), list(enumerate(stacked)), train, val, loss)
    for index, (net, twin) in enumerate(zip(stacked, alone)):
        expected = trainer(patience=0).fit(
            twin, train, val, purpose=("member", index), objective=loss.objective, validate=loss.validate
        )
        assert (reports[index].epochs, reports[index].best_epoch) == (expected.epochs, expected.best_epoch)
        assert reports[index].val_error == pytest.approx(expected.val_error, rel=1e-5)
        for key, value in net.state_dict().items():
            torch.testing.assert_close(value, twin.state_dict()[key], rtol=1e-5, atol=1e-6)


def test_the_target_statistics_are_saved_in_the_spec_and_rebuild_the_same_answers():
    train, val = linear_data(200, 1), linear_data(50, 2)
    learner = regression_learner("gens")
    assert learner.awaits_statistics
    learner.take_statistics(train)
    assert not learner.awaits_statistics
    learner.fit(train, val, trainer(epochs=2))
    spec = json.loads(json.dumps(learner.spec()))
    assert spec["task"]["target_std"] == learner.task.target_std
    rebuilt = learner_from_spec(spec)
    rebuilt.load_state_dict(learner.state_dict())
    assert torch.equal(rebuilt.predict_outputs(val.x), learner.predict_outputs(val.x))


def test_a_constant_target_keeps_a_unit_scale():
    task = FEATURES.with_target_statistics(torch.full((10,), 3.0))
    assert (task.target_mean, task.target_std) == (3.0, 1.0)


def test_a_deployed_network_goes_on_answering_in_the_targets_units():
    """A team's regression network, started from its weights, is not rescaled by statistics it never saw."""
    model = "tests.helpers.user_models:tabular_mlp"
    learner = regression_learner("sm", model=model)
    deployed = build_learner("sm", FEATURES, learner_settings("sm", SETTINGS, {"model": model}), 1)
    learner.start_from({k.removeprefix("layers."): v for k, v in deployed.model.state_dict().items()}, "deployed")
    x = linear_data(20, 3).x
    learner.take_statistics(LabeledData(x, torch.full((20,), 100.0)))
    assert (learner.task.target_mean, learner.task.target_std) == (0.0, 1.0)
    deployed.take_statistics(LabeledData(x, torch.zeros(20)))
    with torch.inference_mode():
        assert torch.equal(learner.predict_outputs(x), deployed.model(x)[:, 0])


def test_a_regression_learner_refuses_to_answer_probabilities():
    with pytest.raises(TypeError, match="predict_outputs"):
        regression_learner("sm").predict_proba(linear_data(4, 0).x)


@pytest.mark.parametrize("name", ["switch-lm", "switch-lm-ens", "switch-lm-gens", "switch-lm-gmoe"])
def test_a_language_model_refuses_a_regression_when_built(name):
    settings = learner_settings(name, {}, {})
    with pytest.raises(
        ConfigError, match=r"learner.name: .* cannot learn a regression task; use ens, firefly, gens, gmoe, sm, umix"
    ):
        build_learner(name, FEATURES, settings, 0)
    build_learner(name, TOKENS, settings, 0)


def test_arrays_take_float_targets_where_the_task_is_a_regression(tmp_path):
    path = tmp_path / "amounts.npz"
    np.savez(path, x=np.random.default_rng(0).random((8, 3)), y=np.linspace(0.5, 4.0, 8))
    data = load_npz(path, regression=True)
    assert data.y.dtype == torch.float32 and float(data.y[-1]) == 4.0
    with pytest.raises(ValueError, match="set task.kind: regression"):
        load_npz(path)
    np.savez(path, x=np.zeros((2, 3)), y=np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="1 NaN or infinite targets"):
        load_npz(path, regression=True)


def test_arrays_are_a_regression_by_task_kind_or_by_a_regression_measure(tmp_path):
    np.savez(tmp_path / "test.npz", x=np.zeros((4, 3), dtype=np.float32), y=np.arange(4.0))
    for task_section in ({"kind": "regression"}, {"measure": "mae"}):
        config = build_config(
            {
                "dataset": {"name": "arrays", "input_shape": [3], "test_file": str(tmp_path / "test.npz")},
                "task": task_section,
            }
        )
        stream = load_stream_task(config)
        assert (stream.task.kind, stream.task.num_classes) == ("regression", 1)
        assert stream.test is not None and stream.test.y.dtype == torch.float32
    assert arrays_task(DatasetConfig(input_shape=[3], num_classes=2), TaskConfig()).kind == "classification"
    with pytest.raises(ConfigError, match="dataset.num_classes: a regression"):
        arrays_task(DatasetConfig(input_shape=[3], num_classes=2), TaskConfig(kind="regression"))


def test_the_arrays_regression_measures_are_the_measures_of_a_regression():
    assert set(REGRESSION_MEASURES) == {name for name, cls in MEASURES.items() if "regression" in cls.kinds}
