"""Driving the adaptive and forecast policies chunk by chunk on scripted prequential errors, as the engine would."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from alma_daemon.config import policy_config
from policies import build_policy
from policies.base import Decision, PolicyState


def drive_adaptive(
    error_of: Callable[[int, int, int], float],
    chunks: int,
    *,
    examples: int,
    policy_keys: dict[str, Any] | None = None,
    restart_every_chunk: bool = False,
    first_id: int = 1,
    policy_name: str = "adaptive",
    flops_per_example: float | None = None,
    **state: Any,
) -> list[Decision]:
    """The adaptive (or ``policy_name``) policy's decision on each of ``chunks`` chunks of ``examples`` examples, whose
    prequential measure is ``error_of(chunk, stages done, chunks trained on)``. Chunk n (1-based) has the
    id ``first_id + n - 1``; stages cost ``flops_per_example`` (known from the first stage on); ``state``
    adds PolicyState fields. With ``restart_every_chunk`` the policy goes on after every decision as a
    new one loaded from its saved state."""

    def new_policy():
        return build_policy(policy_config(name=policy_name, **(policy_keys or {})))

    policy = new_policy()
    decisions: list[Decision] = []
    pending, stages, trained = 0, 0, 0
    for chunk in range(1, chunks + 1):
        pending += 1
        decision = policy.decide(
            PolicyState(
                chunks_seen=chunk,
                chunks_pending=pending,
                examples_pending=pending * examples,
                stages_done=stages,
                now=0.0,
                started_at=0.0,
                train_flops_total=0.0,
                train_seconds_total=0.0,
                flops_per_example=flops_per_example if stages else None,
                next_stage_examples=pending * examples,
                prequential=error_of(chunk, stages, trained),
                prequential_examples=examples,
                newest_chunk=first_id + chunk - 1,
                **state,
            )
        )
        decisions.append(decision)
        if restart_every_chunk:
            saved = json.loads(json.dumps(policy.state_dict()))
            policy = new_policy()
            policy.load_state_dict(saved)
        if decision.trains:
            pending, stages, trained = 0, stages + 1, trained + pending
    return decisions
