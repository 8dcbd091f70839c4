"""The shipped policy contract (``alma_daemon.testing.yield_policy_checks``), run on every registered
policy: one test per check of each config its ``contract_configs()`` declares.

A new policy gets this battery by registering itself and declaring ``contract_configs()``; its own
behaviour goes in tests/test_policies.py.
"""

from __future__ import annotations

import time

import pytest

from alma_daemon.testing import ContractError, yield_policy_checks
from policies import POLICIES, Decision, policy_names


def battery():
    for name in policy_names():
        for index, keys in enumerate(POLICIES[name].contract_configs()):
            for check in yield_policy_checks(name, keys):
                yield pytest.param(check, id=f"{name}-{index}-{check.name}")


def test_every_policy_declares_contract_configs():
    for name in policy_names():
        assert POLICIES[name].contract_configs(), f"{name} declares no contract config"


@pytest.mark.parametrize("check", list(battery()))
def test_policy_contract(check):
    check()


#: (how fixed's decide is broken, the check that must catch it): every check can fail.
BREAKAGES = [
    (lambda decide: lambda self, state: Decision.wait(" "), "decisions_have_reasons_and_some_train"),
    (lambda decide: lambda self, state: Decision.train("always"), "no_training_when_nothing_is_pending"),
    (
        lambda decide: lambda self, state: decide(self, state) if time.time() else None,
        "decisions_depend_on_config_state_and_loaded_state_only",
    ),
    (lambda decide: lambda self, state: Decision.grow("grows"), "grow_every_0_applies_to_a_growing_learner"),
]


@pytest.mark.parametrize("breaking,check_name", BREAKAGES, ids=[b[1] for b in BREAKAGES])
def test_a_check_fails_on_a_policy_that_breaks_it(monkeypatch, breaking, check_name):
    fixed = POLICIES["fixed"]
    monkeypatch.setattr(fixed, "decide", breaking(fixed.decide))
    checks = {check.name: check for check in yield_policy_checks("fixed", {"wait": 1})}
    with pytest.raises(ContractError, match="^fixed: "):
        checks[check_name]()


def test_state_that_does_not_survive_json_fails_the_contract(monkeypatch):
    monkeypatch.setattr(POLICIES["fixed"], "state_dict", lambda self: {"last": (1, 2)})
    checks = {check.name: check for check in yield_policy_checks("fixed", {"wait": 1})}
    with pytest.raises(ContractError, match="its state changes through JSON"):
        checks["state_dict_round_trips_through_json"]()


@pytest.mark.parametrize("unit", ["chunks", "seconds"])
def test_a_policy_that_ignores_the_freshness_bound_fails_the_contract(monkeypatch, unit):
    fixed = POLICIES["fixed"]
    monkeypatch.setattr(fixed, "decide_within_bounds", fixed.decide)
    checks = {check.name: check for check in yield_policy_checks("fixed", {"wait": 40})}
    with pytest.raises(ContractError, match="past its bound"):
        checks[f"honours_a_freshness_bound_in_{unit}"]()
