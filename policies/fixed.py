"""fixed: wait until ``policy.wait`` chunks have accumulated, then train (Algorithm 1).

``wait=1`` is the greedy learner; ``wait=B`` (the stream's length) the tardy one.
"""

from __future__ import annotations

from policies import register_policy
from policies.base import Decision, Policy, PolicyState


@register_policy
class FixedWait(Policy):
    """Train every ``wait`` chunks."""

    name = "fixed"

    @classmethod
    def contract_configs(cls) -> list[dict]:
        return [{"wait": 1}, {"wait": 3}]

    def decide(self, state: PolicyState) -> Decision:
        wait = self.config.wait
        if state.chunks_pending >= wait:
            return self.train_decision(state, f"{state.chunks_pending} chunk(s) pending >= wait {wait}")
        return Decision(False, False, f"{state.chunks_pending} chunk(s) pending < wait {wait}")
