"""The contract every registered learner passes (River-style: one battery, every plugin).

Adding a learner means registering it and, if needed, declaring its cases in ``contract_cases()``;
no new test suite. Cases run on tiny synthetic data so the whole module stays fast on a 2-core CPU.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from alma_daemon.config import TrainConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner, learner_class, learner_from_spec, learner_names
from alma_daemon.training.loop import Trainer
from tests.conftest import learner_settings, separable_data

CIFAR_LIKE = TaskInfo(
    "classification", (32, 32, 3), 4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), channels_last=True, augment=True
)
TOKENS = TaskInfo("language_model", (16,), 50, extra={"vocab_size": 50})


def token_data(n: int, seed: int) -> LabeledData:
    """Sequences of a repeating pattern, so next-token prediction is learnable."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 50, (n, 1), generator=g)
    seq = (start + torch.arange(17)) % 50
    return LabeledData(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


TASKS = {
    "mlp": (MNIST_TASK, lambda n, seed: separable_data(MNIST_TASK, n, seed), 256),
    "vgg": (CIFAR_LIKE, lambda n, seed: separable_data(CIFAR_LIKE, n, seed), 64),
    "tokens": (TOKENS, token_data, 64),
}
OPTIMIZER = {"mlp": "adadelta", "vgg": "sgd", "tokens": "adam"}


def cases():
    for name in learner_names():
        for task_name, overrides in learner_class(name).contract_cases():
            yield pytest.param(
                name, task_name, overrides, id=f"{name}-{task_name}-{json.dumps(overrides, sort_keys=True)}"
            )


def test_every_learner_declares_contract_cases():
    # A learner without cases would drop out of the parametrized battery below without a failure.
    for name in learner_names():
        declared = learner_class(name).contract_cases()
        assert declared, f"{name} declares no contract case"
        assert {task_name for task_name, _ in declared} <= set(TASKS), (name, declared)


def make(name: str, task_name: str, overrides: dict, seed: int = 0):
    task, data_fn, n = TASKS[task_name]
    config = learner_settings(name, {"width": 8, "members": 2}, overrides)
    learner = build_learner(name, task, config, seed)
    train, val = data_fn(n, seed=1), data_fn(n // 4, seed=2)
    return learner, train, val


def trainer(task_name: str, stage: int = 1) -> Trainer:
    config = TrainConfig(epochs=2, patience=1, batch_size=32, steps_per_chunk=4, warmup_steps=1)
    return Trainer(config, OPTIMIZER[task_name], torch.device("cpu"), seed=stage, augment=task_name == "vgg")


def fit_stage(learner, train, val, task_name, stage=1, grow=False):
    t = trainer(task_name, stage)
    torch.manual_seed(stage)
    if grow and learner.grows:
        learner.grow(val, t)
        learner.architecture_changed()
    return learner.fit(train, val, t)


def assert_same_predictions(a, b, x):
    torch.testing.assert_close(a.predict_proba(x), b.predict_proba(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name,task_name,overrides", list(cases()))
class TestLearnerContract:
    def test_fit_reports_cost_and_keeps_predictions_valid(self, name, task_name, overrides):
        learner, train, val = make(name, task_name, overrides)
        report = fit_stage(learner, train, val, task_name)
        assert report.flops > 0 and report.steps > 0 and report.seconds >= 0
        proba = learner.predict_proba(val.x)
        assert torch.isfinite(proba).all()
        torch.testing.assert_close(proba.sum(-1), torch.ones(proba.shape[:-1]), atol=1e-4, rtol=0)
        value = learner.evaluate(val)[learner.measure]
        assert value == value and value >= 0  # not NaN

    def test_parameter_count_matches_the_modules(self, name, task_name, overrides):
        learner, _, _ = make(name, task_name, overrides)
        assert learner.num_parameters() == sum(p.numel() for p in learner.model.parameters()) > 0
        assert learner.inference_flops_per_example() > 0

    def test_spec_rebuilds_the_exact_model(self, name, task_name, overrides, tmp_path):
        learner, train, val = make(name, task_name, overrides)
        fit_stage(learner, train, val, task_name, stage=1)
        fit_stage(learner, train, val, task_name, stage=2, grow=True)
        spec = json.loads(json.dumps(learner.spec()))
        rebuilt = learner_from_spec(spec)
        rebuilt.load_state_dict(learner.state_dict())
        assert rebuilt.num_parameters() == learner.num_parameters()
        assert_same_predictions(learner, rebuilt, val.x)
        store = CheckpointStore(tmp_path, "m")
        store.save(learner, 1, {"val_error": 0.0})
        assert_same_predictions(learner, store.load(1), val.x)

    def test_same_seed_same_data_same_model(self, name, task_name, overrides):
        runs = []
        for _ in range(2):
            learner, train, val = make(name, task_name, overrides)
            fit_stage(learner, train, val, task_name, stage=1)
            fit_stage(learner, train, val, task_name, stage=2, grow=True)
            runs.append(learner)
        a, b = (r.state_dict() for r in runs)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key

    def test_different_seeds_give_different_models(self, name, task_name, overrides):
        a, _, val = make(name, task_name, overrides, seed=0)
        b, _, _ = make(name, task_name, overrides, seed=1)
        assert not torch.equal(a.predict_proba(val.x), b.predict_proba(val.x))

    def test_reinitialize_keeps_architecture_and_changes_weights(self, name, task_name, overrides):
        learner, _, val = make(name, task_name, overrides)
        before = learner.predict_proba(val.x)
        count = learner.num_parameters()
        learner.reinitialize(1234)
        assert learner.num_parameters() == count
        assert not torch.equal(before, learner.predict_proba(val.x))

    def test_config_in_spec_is_complete(self, name, task_name, overrides):
        learner, _, _ = make(name, task_name, overrides)
        spec = learner.spec()
        assert spec["learner"] == name
        assert spec["config"] == dataclasses.asdict(learner.config)
