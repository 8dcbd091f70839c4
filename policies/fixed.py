"""fixed: wait until ``policy.wait`` chunks have accumulated, then train (Algorithm 1).

``wait=1`` is the greedy learner; ``wait=B`` (the stream's length) the tardy one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import ConfigError, PolicyConfig
from alma_daemon.config.base import PLUGIN_SECTION, Int
from policies.base import Decision, Policy, PolicyState


@dataclass(config=PLUGIN_SECTION)
class FixedWaitConfig(PolicyConfig):
    """fixed: the number of chunks to wait for."""

    name: Literal["fixed"] = "fixed"
    wait: Int = Field(
        default=1, gt=0, description="Train once this many chunks have accumulated (1 = greedy, B = tardy)."
    )

    def check_stream_length(self, megabatches: int) -> None:
        if self.wait > megabatches:
            raise ConfigError(
                f"policy.wait ({self.wait}) is larger than stream.megabatches ({megabatches}): the run would never train"
            )


class FixedWait(Policy):
    """Train every ``wait`` chunks."""

    name = "fixed"
    config_model = FixedWaitConfig
    config: FixedWaitConfig

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        return [{"wait": 1}, {"wait": 3}]

    def decide(self, state: PolicyState) -> Decision:
        wait = self.config.wait
        if state.chunks_pending >= wait:
            return self.train_decision(state, f"{state.chunks_pending} chunk(s) pending >= wait {wait}")
        return Decision.wait(f"{state.chunks_pending} chunk(s) pending < wait {wait}")
