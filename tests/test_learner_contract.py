"""The shipped learner contract (``alma_daemon.testing.yield_learner_checks``), run on every registered
learner: one test per check of each case its ``contract_cases()`` declares (River's ``yield_checks``).

Adding a learner means registering it and, if needed, declaring its cases; no new test suite. Cases run
on tiny synthetic data (tests/helpers/contract.py) so the whole module stays fast on a 2-core CPU.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from alma_daemon.learners import learner_class, learner_names
from alma_daemon.testing import ContractError, yield_learner_checks
from tests.helpers.contract import TASKS, contract_keys


def case_id(name: str, task_name: str, overrides: dict) -> str:
    return "-".join([name, task_name, *(f"{key}={value}" for key, value in sorted(overrides.items()))])


def battery():
    for name in learner_names():
        for task_name, overrides in learner_class(name).contract_cases():
            case = TASKS[task_name]
            train, val = case.split()
            checks = yield_learner_checks(name, case.task, train, val, contract_keys(name, overrides), case.optimizer)
            for check in checks:
                marks = [pytest.mark.slow] if check.slow else []
                yield pytest.param(check, id=f"{case_id(name, task_name, overrides)}-{check.name}", marks=marks)


def test_every_learner_declares_a_contract_case_for_each_task_kind_it_learns():
    # A learner without cases would drop out of the parametrized battery below without a failure.
    for name in learner_names():
        declared = learner_class(name).contract_cases()
        assert {task_name for task_name, _ in declared} <= set(TASKS), (name, declared)
        kinds = {TASKS[task_name].task.kind for task_name, _ in declared}
        assert kinds == set(learner_class(name).task_kinds), f"{name}: its cases cover {kinds}"


@pytest.mark.parametrize("check", list(battery()))
def test_learner_contract(check):
    check()


#: (method of sm, how it is broken, task, the check that must catch it): every check can fail.
BREAKAGES = [
    ("forward_proba", lambda forward: lambda self, x: forward(self, x) * 2, "mlp", "probabilities_sum_to_one"),
    ("forward_proba", lambda forward: lambda self, x: forward(self, x) - 1, "mlp", "probabilities_are_between_0_and_1"),
    (
        "forward_prediction",
        lambda forward: lambda self, x: forward(self, x) * math.nan,
        "regression",
        "numbers_are_finite",
    ),
    (
        "fit",
        lambda fit: lambda self, *a: dataclasses.replace(fit(self, *a), seconds=0.0),
        "mlp",
        "stages_report_their_cost",
    ),
    (
        "build",
        lambda build: lambda self, arch: torch.manual_seed(0) and build(self, arch),
        "mlp",
        "seeds_give_different_models",
    ),
    (
        "outputs",
        lambda outputs: lambda self, data: outputs(self, data) + 1,
        "regression",
        "measured_answers_are_its_predictions",
    ),
]


@pytest.mark.parametrize("method,breaking,task_name,check_name", BREAKAGES, ids=[b[3] for b in BREAKAGES])
def test_a_check_fails_on_a_learner_that_breaks_it(monkeypatch, method, breaking, task_name, check_name):
    sm = learner_class("sm")
    monkeypatch.setattr(sm, method, breaking(getattr(sm, method)))
    case = TASKS[task_name]
    train, val = case.split()
    checks = {check.name: check for check in yield_learner_checks("sm", case.task, train, val, {"width": 8})}
    with pytest.raises(ContractError, match="^sm: "):
        checks[check_name]()
