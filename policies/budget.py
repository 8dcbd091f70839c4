"""budget: train when the pending data's estimated cost fits a compute budget per hour of wall time.

The next stage's cost is estimated from the last stage's cost per training example times the
examples the next stage would fit on. The policy trains only if, after that stage, the average
spend since ``started_at`` stays within ``policy.flops_per_hour`` and/or ``policy.gpu_seconds_per_hour``
(the stage's estimated duration counts as elapsed time, since the spend happens over it). Before
any cost has been measured it trains as soon as a chunk is pending.

Without replay every example is trained on once whatever the waiting time, so if data arrives
faster than the budget pays for, waiting does not catch up and the policy keeps waiting; its
reason shows the numbers. With replay every stage retrains on all kept chunks, so waiting saves compute.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import ConfigError, PolicyConfig
from alma_daemon.config.base import PLUGIN_SECTION, Float
from policies.base import Decision, Policy, PolicyState


@dataclass(config=PLUGIN_SECTION)
class BudgetConfig(PolicyConfig):
    """budget: one or both of a compute budget per hour of wall time."""

    name: Literal["budget"] = "budget"
    flops_per_hour: Float | None = Field(
        default=None, gt=0, description="Training FLOPs allowed per hour of wall time."
    )
    gpu_seconds_per_hour: Float | None = Field(
        default=None, gt=0, description="GPU-seconds allowed per hour of wall time."
    )

    def __post_init__(self) -> None:
        if self.flops_per_hour is None and self.gpu_seconds_per_hour is None:
            raise ConfigError(
                "policy.flops_per_hour / policy.gpu_seconds_per_hour: the budget policy needs at least one"
            )


class Budget(Policy):
    """Train when spending the next stage's estimated compute keeps the hourly average within budget."""

    name = "budget"
    config_model = BudgetConfig
    config: BudgetConfig
    time_based = True

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        # The contract's stream spends 1.5e10 FLOPs and 75 GPU-s per hour if trained greedily: one
        # budget is loose, the others bind so that the policy both waits and trains.
        return [
            {"flops_per_hour": 1e12},
            {"gpu_seconds_per_hour": 80.0},
            {"flops_per_hour": 1.6e10, "gpu_seconds_per_hour": 3600.0},
        ]

    def decide(self, state: PolicyState) -> Decision:
        pending = state.chunks_pending
        if pending == 0:
            return Decision.wait("no chunk pending")
        # (unit, budget per hour, spent so far, last stage's cost per training example)
        budgets = []
        if self.config.flops_per_hour is not None:
            budgets.append(("FLOPs", self.config.flops_per_hour, state.train_flops_total, state.flops_per_example))
        if self.config.gpu_seconds_per_hour is not None:
            budgets.append(
                ("GPU-s", self.config.gpu_seconds_per_hour, state.train_seconds_total, state.train_seconds_per_example)
            )
        unmeasured = [unit for unit, _, _, per_example in budgets if per_example is None]
        if unmeasured:
            return self.train_decision(
                state,
                f"{pending} chunk(s) pending and no {'/'.join(unmeasured)} per example measured "
                f"after {state.stages_done} stage(s) to estimate the next one",
            )
        examples = state.next_stage_examples if state.next_stage_examples is not None else state.examples_pending
        duration = (state.train_seconds_per_example or 0.0) * examples
        hours = (state.now - state.started_at + duration) / 3600
        fits = True
        checks = []
        for unit, per_hour, spent, per_example in budgets:
            assert per_example is not None  # an unmeasured budget returned above
            cost = per_example * examples
            allowed = per_hour * hours
            within = spent + cost <= allowed
            fits = fits and within
            checks.append(
                f"{unit}: spent {spent:.3g} + next stage {cost:.3g} ({per_example:.3g}/example x {examples}) "
                f"{'<=' if within else '>'} {allowed:.3g} allowed ({per_hour:.3g}/h x {hours:.3g} h)"
            )
        reason = f"{pending} chunk(s) pending, {'within' if fits else 'over'} budget: " + "; ".join(checks)
        return self.train_decision(state, reason) if fits else Decision.wait(reason)
