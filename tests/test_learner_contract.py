"""The contract every registered learner passes (River-style: one battery, every plugin).

Adding a learner means registering it and, if needed, declaring its cases in ``contract_cases()``;
no new test suite. Cases run on tiny synthetic data so the whole module stays fast on a 2-core CPU.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.learners import learner_class, learner_from_spec, learner_names
from tests.helpers.contract import TASKS, fit_stage, make


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

    @pytest.mark.slow
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

    @pytest.mark.slow
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
