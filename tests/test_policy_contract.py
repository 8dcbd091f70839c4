"""The contract every registered waiting-time policy passes, run on each config it declares.

A new policy gets this battery by registering itself and declaring ``contract_configs()``; its own
behaviour goes in tests/test_policies.py. Each config is driven through the same simulated stream,
the bookkeeping an engine does around a policy: a chunk of 100 examples every 40 minutes, a
periodic check in between, stages costing 1e8 FLOPs and 0.5 s per example, and a prequential
error on each new chunk that falls as the model trains on more chunks.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
import typing
from dataclasses import dataclass

import pytest

from alma_daemon.config import ConfigError, policy_config
from alma_daemon.measures import MEASURES
from policies import POLICIES, Decision, Policy, PolicyState, build_policy, policy_config_models, policy_names

T0 = 1_704_067_200.0  # 2024-01-01 00:00 UTC, a Monday
STEP_SECONDS = 20 * 60
#: Three days, so daily and weekday schedules fire more than once.
STEPS = 3 * 24 * 3600 // STEP_SECONDS
EXAMPLES_PER_CHUNK = 100
FLOPS_PER_EXAMPLE = 1e8
SECONDS_PER_EXAMPLE = 0.5

CASES = [
    pytest.param(name, kwargs, id=f"{name}-{i}")
    for name in policy_names()
    for i, kwargs in enumerate(POLICIES[name].contract_configs())
]


@dataclass
class Stream:
    """What the engine tracks around a policy; trains (instantly) whenever told to."""

    learner_grows: bool = True
    #: The task's measure the prequential values are in (alma_daemon/measures).
    measure: str = "error"
    now: float = T0
    chunks_seen: int = 0
    chunks_pending: int = 0
    stages_done: int = 0
    flops: float = 0.0
    seconds: float = 0.0

    def state(self, new_chunk: bool = False) -> PolicyState:
        measured = self.stages_done > 0
        trained = self.chunks_seen - self.chunks_pending
        return PolicyState(
            chunks_seen=self.chunks_seen,
            chunks_pending=self.chunks_pending,
            examples_pending=self.chunks_pending * EXAMPLES_PER_CHUNK,
            stages_done=self.stages_done,
            now=self.now,
            started_at=T0,
            train_flops_total=self.flops,
            train_seconds_total=self.seconds,
            flops_per_example=FLOPS_PER_EXAMPLE if measured else None,
            train_seconds_per_example=SECONDS_PER_EXAMPLE if measured else None,
            next_stage_examples=self.chunks_pending * EXAMPLES_PER_CHUNK,
            learner_grows=self.learner_grows,
            prequential=self.measured(0.1 + 0.8 / (1 + trained)) if new_chunk else None,
            prequential_examples=EXAMPLES_PER_CHUNK if new_chunk else 0,
            prequential_unit_variance=0.25 if new_chunk else None,
            measure=self.measure,
        )

    def measured(self, loss: float) -> float:
        """A falling loss in the units of :attr:`measure`."""
        if self.measure == "perplexity":
            return math.exp(5 * loss)
        return 1 - loss if MEASURES[self.measure].higher_is_better else loss

    def run(self, policy: Policy, steps: int) -> list[tuple[PolicyState, dict, Decision]]:
        """``steps`` checks 20 minutes apart, a chunk arriving before every other one."""
        trace = []
        for step in range(steps):
            self.now += STEP_SECONDS
            new_chunk = step % 2 == 0
            if new_chunk:
                self.chunks_seen += 1
                self.chunks_pending += 1
            state = self.state(new_chunk)
            before = policy.state_dict()
            decision = policy.decide(state)
            trace.append((state, before, decision))
            if decision.trains:
                examples = self.chunks_pending * EXAMPLES_PER_CHUNK
                self.stages_done += 1
                self.flops += FLOPS_PER_EXAMPLE * examples
                self.seconds += SECONDS_PER_EXAMPLE * examples
                self.chunks_pending = 0
        return trace


def build(name: str, kwargs: dict, **overrides) -> Policy:
    return build_policy(policy_config(name=name, **{**kwargs, **overrides}))


def test_every_policy_declares_contract_configs():
    for name in policy_names():
        assert POLICIES[name].contract_configs(), f"{name} declares no contract config"


@pytest.mark.parametrize("name,kwargs", CASES)
def test_decisions_are_well_formed_and_some_train(name, kwargs):
    trace = Stream().run(build(name, kwargs), STEPS)
    for _, _, decision in trace:
        assert isinstance(decision, Decision)
        assert isinstance(decision.reason, str) and decision.reason.strip()
    assert sum(decision.trains for _, _, decision in trace) >= 2, "the stream never exercises training"


@pytest.mark.parametrize("name,kwargs", CASES)
@pytest.mark.parametrize("measure", ["recall", "cost", "mse", "perplexity"])
def test_every_policy_decides_on_any_task_measure_and_keeps_its_state(name, kwargs, measure):
    policy = build(name, kwargs)
    stream = Stream(measure=measure)
    trace = stream.run(policy, STEPS // 2)
    assert sum(decision.trains for _, _, decision in trace) >= 2, "the stream never exercises training"
    saved = json.loads(json.dumps(policy.state_dict()))
    clone = build(name, kwargs)
    clone.load_state_dict(saved)
    original = [d for _, _, d in copy.deepcopy(stream).run(policy, STEPS // 4)]
    assert [d for _, _, d in stream.run(clone, STEPS // 4)] == original


@pytest.mark.parametrize("name,kwargs", CASES)
@pytest.mark.parametrize("grow_every", [0, 1, 2])
@pytest.mark.parametrize("learner_grows", [True, False])
def test_grow_every_applies_uniformly(name, kwargs, grow_every, learner_grows):
    trace = Stream(learner_grows=learner_grows).run(build(name, kwargs, grow_every=grow_every), STEPS)
    for state, _, decision in trace:
        stage = state.stages_done + 1
        if POLICIES[name].decides_growth:
            # Its own growth timing, but only with training, for a learner that grows, and never with 0.
            assert not decision.grows or (decision.trains and learner_grows and grow_every > 0), (stage, decision)
            continue
        expected = decision.trains and learner_grows and grow_every > 0 and stage % grow_every == 0
        assert decision.grows == expected, (stage, decision)


@pytest.mark.parametrize("name,kwargs", CASES)
def test_no_training_when_nothing_is_pending(name, kwargs):
    policy = build(name, kwargs)
    stream = Stream()
    assert not policy.decide(stream.state()).trains, "trained before any chunk"
    stream.run(policy, STEPS // 2)
    stream.chunks_pending = 0
    start = stream.now
    for later in (0, 59, 3600, 86_400, 7 * 86_400):
        stream.now = start + later
        decision = policy.decide(stream.state())
        assert not decision.trains, decision


@pytest.mark.parametrize("name,kwargs", CASES)
def test_state_dict_round_trips_through_json(name, kwargs):
    policy = build(name, kwargs)
    stream = Stream()
    stream.run(policy, STEPS // 2)
    saved = policy.state_dict()
    restored = json.loads(json.dumps(saved))
    assert restored == saved
    clone = build(name, kwargs)
    clone.load_state_dict(restored)
    rest = STEPS - STEPS // 2
    original = [d for _, _, d in copy.deepcopy(stream).run(policy, rest)]
    assert [d for _, _, d in stream.run(clone, rest)] == original


@pytest.mark.parametrize("name,kwargs", CASES)
def test_decision_is_a_function_of_config_state_and_loaded_state(name, kwargs, monkeypatch):
    def no_clock() -> float:
        raise AssertionError("a policy must read the time from PolicyState.now")

    with monkeypatch.context() as patch:
        for clock in ("time", "time_ns", "monotonic"):
            patch.setattr(time, clock, no_clock)
        for state, before, decision in Stream().run(build(name, kwargs), STEPS):
            for _ in range(2):
                fresh = build(name, kwargs)
                fresh.load_state_dict(json.loads(json.dumps(before)))
                assert fresh.decide(state) == decision


@pytest.mark.parametrize("name,kwargs", CASES)
def test_keys_of_other_policies_are_rejected(name, kwargs):
    own = {f.name for f in dataclasses.fields(POLICIES[name].config_model)}
    for model in policy_config_models().values():
        hints = typing.get_type_hints(model)
        for key in {f.name for f in dataclasses.fields(model)} - own:
            value = "0 2 * * *" if str in (hints[key], *typing.get_args(hints[key])) else 1.0
            with pytest.raises(ConfigError, match=f"policy.{key}"):
                build(name, kwargs, **{key: value})
