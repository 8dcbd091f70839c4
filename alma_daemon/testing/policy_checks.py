"""The waiting-time policy contract as named checks (:func:`yield_policy_checks`); :func:`check_policy`
runs them all. tests/test_policy_contract.py runs each as its own test on every registered policy and
each config of its ``contract_configs()``.

Each check drives the policy through the same simulated stream, the bookkeeping an engine does around
a policy: a chunk of 100 examples every 40 minutes, a periodic check in between, stages costing 1e8
FLOPs and 0.5 s per example, and a prequential measure on each new chunk that improves as the model
trains on more chunks.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from unittest import mock

from alma_daemon.config import ConfigError, policy_config
from alma_daemon.measures import MEASURES
from alma_daemon.testing.checks import Check, ContractError, expect, run_checks
from policies import POLICIES, Decision, Policy, PolicyState, build_policy, policy_config_models

T0 = 1_704_067_200.0  # 2024-01-01 00:00 UTC, a Monday
STEP_SECONDS = 20 * 60
#: Three days, so daily and weekday schedules fire more than once.
STEPS = 3 * 24 * 3600 // STEP_SECONDS
EXAMPLES_PER_CHUNK = 100
FLOPS_PER_EXAMPLE = 1e8
SECONDS_PER_EXAMPLE = 0.5
#: Task measures a policy decides on besides the error: higher-is-better, a cost, a regression's, a perplexity.
MEASURES_DECIDED_ON = ("recall", "cost", "mse", "perplexity")
GROW_EVERY = (0, 1, 2)

Trace = list[tuple[PolicyState, dict[str, Any], Decision]]


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
    #: chunks_seen and the time at the last stage: the model's age counts from them.
    last_stage_chunks: int = 0
    last_stage_at: float = T0

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
            model_age_chunks=self.chunks_seen - self.last_stage_chunks,
            model_age_seconds=self.now - self.last_stage_at,
        )

    def measured(self, loss: float) -> float:
        """A falling loss in the units of :attr:`measure`."""
        if self.measure == "perplexity":
            return math.exp(5 * loss)
        return 1 - loss if MEASURES[self.measure].higher_is_better else loss

    def run(self, policy: Policy, steps: int) -> Trace:
        """``steps`` checks 20 minutes apart, a chunk arriving before every other one; each step's state,
        the policy's state before it decided, and its decision."""
        trace = []
        for step in range(steps):
            self.now += STEP_SECONDS
            new_chunk = step % 2 == 0
            if new_chunk:
                self.chunks_seen += 1
                self.chunks_pending += 1
            state = self.state(new_chunk)
            before = policy.state_dict()
            decision = policy.decide_within_bounds(state)
            trace.append((state, before, decision))
            if decision.trains:
                examples = self.chunks_pending * EXAMPLES_PER_CHUNK
                self.stages_done += 1
                self.last_stage_chunks, self.last_stage_at = self.chunks_seen, self.now
                self.flops += FLOPS_PER_EXAMPLE * examples
                self.seconds += SECONDS_PER_EXAMPLE * examples
                self.chunks_pending = 0
        return trace


class PolicyUnderCheck:
    """Policy ``name`` with the ``policy`` keys ``keys``, built afresh for each run of a check."""

    def __init__(self, name: str, keys: Mapping[str, Any]):
        self.name = name
        self.keys = dict(keys)

    def build(self, **overrides: Any) -> Policy:
        return build_policy(policy_config(name=self.name, **{**self.keys, **overrides}))

    def trains_twice(self, trace: Trace) -> None:
        # Without two stages the checks that follow would pass on a policy that never trains.
        expect(sum(d.trains for _, _, d in trace) >= 2, f"{self.name}: trains fewer than twice in the stream")

    def resumes_alike(self, policy: Policy, stream: Stream, steps: int, what: str) -> None:
        """A policy built afresh that loads ``policy``'s state, through JSON, decides as it does next."""
        saved = json.loads(json.dumps(policy.state_dict()))
        clone = self.build()
        clone.load_state_dict(saved)
        original = [d for _, _, d in copy.deepcopy(stream).run(policy, steps)]
        expect([d for _, _, d in stream.run(clone, steps)] == original, f"{self.name}: {what}, it decides otherwise")


def decisions_have_reasons_and_some_train(policy: PolicyUnderCheck) -> None:
    trace = Stream().run(policy.build(), STEPS)
    for state, _, decision in trace:
        expect(isinstance(decision, Decision), f"{policy.name}: decided {decision!r}, not a Decision")
        expect(
            isinstance(decision.reason, str) and bool(decision.reason.strip()),
            f"{policy.name}: a decision without a reason at {state.now}",
        )
    policy.trains_twice(trace)


def decides_on_the_measure(measure: str, policy: PolicyUnderCheck) -> None:
    built, stream = policy.build(), Stream(measure=measure)
    policy.trains_twice(stream.run(built, STEPS // 2))
    policy.resumes_alike(built, stream, STEPS // 4, f"on {measure}, reloaded from its state")


def grow_every_applies(grow_every: int, learner_grows: bool, policy: PolicyUnderCheck) -> None:
    trace = Stream(learner_grows=learner_grows).run(policy.build(grow_every=grow_every), STEPS)
    for state, _, decision in trace:
        stage = state.stages_done + 1
        if POLICIES[policy.name].decides_growth:
            # Its own growth timing, but only with training, for a learner that grows, and never with 0.
            allowed = decision.trains and learner_grows and grow_every > 0
            expect(not decision.grows or allowed, f"{policy.name}: stage {stage}: {decision}")
        else:
            expected = decision.trains and learner_grows and grow_every > 0 and stage % grow_every == 0
            expect(decision.grows == expected, f"{policy.name}: stage {stage}: {decision}, grows should be {expected}")


def no_training_when_nothing_is_pending(policy: PolicyUnderCheck) -> None:
    built, stream = policy.build(), Stream()
    expect(not built.decide_within_bounds(stream.state()).trains, f"{policy.name}: trained before any chunk")
    stream.run(built, STEPS // 2)
    stream.chunks_pending = 0
    start = stream.now
    for later in (0, 59, 3600, 86_400, 7 * 86_400):
        stream.now = start + later
        decision = built.decide_within_bounds(stream.state())
        expect(not decision.trains, f"{policy.name}: with nothing pending, {later} s later: {decision}")


def state_dict_round_trips_through_json(policy: PolicyUnderCheck) -> None:
    built, stream = policy.build(), Stream()
    stream.run(built, STEPS // 2)
    saved = built.state_dict()
    expect(json.loads(json.dumps(saved)) == saved, f"{policy.name}: its state changes through JSON: {saved}")
    policy.resumes_alike(built, stream, STEPS - STEPS // 2, "reloaded from its state")


def decisions_depend_on_config_state_and_loaded_state_only(policy: PolicyUnderCheck) -> None:
    def clock() -> float:
        raise ContractError(f"{policy.name}: reads the clock; a policy reads the time from PolicyState.now")

    with (
        mock.patch.object(time, "time", clock),
        mock.patch.object(time, "time_ns", clock),
        mock.patch.object(time, "monotonic", clock),
    ):
        for state, before, decision in Stream().run(policy.build(), STEPS):
            for _ in range(2):
                fresh = policy.build()
                fresh.load_state_dict(json.loads(json.dumps(before)))
                again = fresh.decide_within_bounds(state)
                expect(again == decision, f"{policy.name}: decided {decision}, then {again} at {state.now}")


#: Freshness bounds the checks set (policy.max_model_age_*), by the unit they bound: tighter than most
#: policies' own waits on the stream.
FRESHNESS_BOUNDS: dict[str, dict[str, Any]] = {
    "chunks": {"max_model_age_chunks": 2, "max_model_age_seconds": None},
    "examples": {"max_model_age_examples": 150, "max_model_age_seconds": None},
    "seconds": {"max_model_age_seconds": 3 * 3600.0},
}


def honours_the_freshness_bound(bound: Mapping[str, Any], policy: PolicyUnderCheck) -> None:
    built = policy.build(**bound)
    chunks, seconds = built.config.max_model_age_chunks, built.config.max_model_age_seconds
    examples = built.config.max_model_age_examples
    for state, _, decision in Stream().run(built, STEPS):
        overdue = state.chunks_pending > 0 and (
            (chunks is not None and state.model_age_chunks >= chunks)
            or (examples is not None and state.examples_pending >= examples)
            or (seconds is not None and state.model_age_seconds >= seconds)
        )
        expect(
            decision.trains or not overdue,
            f"{policy.name}: waited with a model {state.model_age_chunks} chunk(s) and {state.model_age_seconds:.0f} s "
            f"old, past its bound {dict(bound)}: {decision.reason}",
        )


def keys_of_other_policies_are_rejected(policy: PolicyUnderCheck) -> None:
    own = {f.name for f in dataclasses.fields(POLICIES[policy.name].config_model)}
    for model in policy_config_models().values():
        hints = typing.get_type_hints(model)
        for key in {f.name for f in dataclasses.fields(model)} - own:
            value = "0 2 * * *" if str in (hints[key], *typing.get_args(hints[key])) else 1.0
            try:
                policy.build(**{key: value})
                answer = "takes it"
            except ConfigError as refused:
                answer = f"refuses it saying: {refused}"
            expect(
                answer.startswith("refuses") and f"policy.{key}" in answer,
                f"{policy.name}: given policy.{key}, a key of another policy, it {answer}",
            )


def yield_policy_checks(name: str, keys: Mapping[str, Any] | None = None) -> Iterator[Check]:
    """Every check of policy ``name`` with the ``policy`` keys ``keys`` (those of ``policy.name`` aside)."""
    policy = PolicyUnderCheck(name, keys or {})
    yield Check("decisions_have_reasons_and_some_train", partial(decisions_have_reasons_and_some_train, policy))
    for measure in MEASURES_DECIDED_ON:
        yield Check(f"decides_on_{measure}_and_resumes", partial(decides_on_the_measure, measure, policy))
    for grow_every in GROW_EVERY:
        for learner_grows, learner in ((True, "growing"), (False, "fixed")):
            applies = partial(grow_every_applies, grow_every, learner_grows, policy)
            yield Check(f"grow_every_{grow_every}_applies_to_a_{learner}_learner", applies)
    for unit, bound in FRESHNESS_BOUNDS.items():
        yield Check(f"honours_a_freshness_bound_in_{unit}", partial(honours_the_freshness_bound, bound, policy))
    for check in (
        no_training_when_nothing_is_pending,
        state_dict_round_trips_through_json,
        decisions_depend_on_config_state_and_loaded_state_only,
        keys_of_other_policies_are_rejected,
    ):
        yield Check(check.__name__, partial(check, policy))


def check_policy(name: str, keys: Mapping[str, Any] | None = None) -> None:
    """Run every check of :func:`yield_policy_checks`: the first that fails raises ContractError."""
    run_checks(yield_policy_checks(name, keys))
