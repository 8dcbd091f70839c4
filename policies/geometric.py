"""geometric: wait a number of chunks that grows with what the model has already trained on.

Train once the pending chunks reach ``max(1, ratio x chunks trained on so far)``. With ``ratio: 0.5``
the stages cover chunks 1, 2, 3, 4-5, 6-8, 9-12, 13-18, ...: each stage brings about half as much data
again as the model has seen, so the number of stages grows with the logarithm of the stream's length.
Under a power-law learning curve one more chunk matters less the more the model has seen, which is
why a growing wait beats every constant one (docs/policies.md has the measurements).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import PolicyConfig
from alma_daemon.config.base import PLUGIN_SECTION, Float
from policies.base import Decision, Policy, PolicyState

#: ``policy.ratio`` when it is not set.
DEFAULT_RATIO = 0.5


def geometric_threshold(ratio: float, chunks_trained: int) -> int:
    """Pending chunks that trigger a stage: ``max(1, ratio x chunks_trained)``, rounded up."""
    # The tolerance keeps 0.5 x 4 at 2, not 3, when the product carries a rounding error.
    return max(1, math.ceil(ratio * chunks_trained - 1e-9))


@dataclass(config=PLUGIN_SECTION)
class GeometricConfig(PolicyConfig):
    """geometric: how fast the wait grows with the chunks trained on."""

    name: Literal["geometric"] = "geometric"
    ratio: Float | None = Field(
        default=None,
        gt=0,
        description="Train once the pending chunks reach ratio x the chunks trained on (None = 0.5).",
    )


class Geometric(Policy):
    """Train when the pending chunks reach ``ratio`` times the chunks trained on so far (at least one)."""

    name = "geometric"
    config_model = GeometricConfig

    def __init__(self, config: GeometricConfig):
        super().__init__(config)
        self.ratio = DEFAULT_RATIO if config.ratio is None else config.ratio

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        return [{}, {"ratio": 2.0}]

    def decide(self, state: PolicyState) -> Decision:
        trained = state.chunks_seen - state.chunks_pending
        threshold = geometric_threshold(self.ratio, trained)
        numbers = f"{state.chunks_pending} chunk(s) pending"
        rule = f"max(1, {self.ratio:g} x {trained} chunk(s) trained on) = {threshold}"
        if state.chunks_pending >= threshold:
            return self.train_decision(state, f"{numbers} >= {rule}")
        return Decision.wait(f"{numbers} < {rule}")
