"""The waiting-time policy interface: after each chunk, decide whether to train (and grow) now."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from alma_daemon.config import PolicyConfig


@dataclass(frozen=True)
class PolicyState:
    """What a policy may look at; built by the engine after a chunk has been buffered."""

    #: Chunks received so far, and those buffered but not yet trained on.
    chunks_seen: int
    chunks_pending: int
    examples_pending: int
    #: Training stages completed so far.
    stages_done: int
    #: Wall-clock time (seconds since the epoch) and resources spent so far.
    now: float
    started_at: float
    train_flops_total: float
    train_seconds_total: float
    #: FLOPs and seconds of the last training stage per training example (None before the first stage).
    flops_per_example: float | None = None
    train_seconds_per_example: float | None = None
    #: Training examples the next stage would fit on (with replay: every kept chunk's); None = unknown.
    next_stage_examples: int | None = None
    #: Whether the learner can grow; policies never ask a fixed architecture to grow.
    learner_grows: bool = False
    #: Whether the learner's growth step leaves the function it computes unchanged (gMoE, Firefly, the
    #: Switch LM's gMoE) rather than adding an untrained part (gEns).
    growth_keeps_function: bool = False
    #: The live model's measure on the newest chunk before training on it (its prequential error, recall,
    #: perplexity...: the task's measure), the examples its standard error counts (a recall's: the
    #: positives), their per-example variance (None: the measure's own rule), and which measure it is
    #: (:func:`alma_daemon.measures.build_measure` by name; :func:`scale_of` reads it). None on a check
    #: between chunks, where no chunk is new.
    prequential: float | None = None
    prequential_examples: int = 0
    prequential_unit_variance: float | None = None
    measure: str = "error"
    #: The id of the newest chunk received (ids increase but need not start at 1 or be consecutive:
    #: a replay from a later chunk, dead-lettered chunks); None before the first.
    newest_chunk: int | None = None
    #: The model's age: chunks arrived (this one included) and seconds passed since the last stage (since
    #: the stream's start before the first), what the freshness bound (policy.max_model_age_*) reads.
    model_age_chunks: int = 0
    model_age_seconds: float = 0.0


#: What a decision does: nothing yet, train on what is pending, or grow the model first and then train.
Action = Literal["wait", "train", "grow+train"]


@dataclass(frozen=True)
class Decision:
    """A policy's answer, with the reason that is logged and shown by ``alma status``.

    Built with :meth:`wait`, :meth:`train` or :meth:`grow`. ``estimates`` holds the numbers a policy
    decided from, by name (exported as metrics where
    :data:`alma_daemon.metrics.POLICY_ESTIMATES` names them); most policies have none.
    """

    action: Action
    reason: str
    estimates: dict[str, float] = field(default_factory=dict)

    @classmethod
    def wait(cls, reason: str, estimates: dict[str, float] | None = None) -> Decision:
        return cls("wait", reason, estimates or {})

    @classmethod
    def train(cls, reason: str, estimates: dict[str, float] | None = None) -> Decision:
        return cls("train", reason, estimates or {})

    @classmethod
    def grow(cls, reason: str, estimates: dict[str, float] | None = None) -> Decision:
        """Grow the model, then train it (a learner that cannot grow only trains)."""
        return cls("grow+train", reason, estimates or {})

    @property
    def trains(self) -> bool:
        return self.action != "wait"

    @property
    def grows(self) -> bool:
        return self.action == "grow+train"


class Policy(ABC):
    """Decides when to train. One module per policy in ``policies/``, registered by ``name``."""

    name: ClassVar[str]
    #: True when a decision can change with the clock alone; only such policies are asked between
    #: chunks (the daemon's periodic check), so the others are not re-asked every second.
    time_based: ClassVar[bool] = False
    #: The ``policy`` section this policy reads, declared next to it; its ``name`` is ``Literal[name]``.
    #: A key of another policy fails at start-up (policy.cron with policy.name fixed would otherwise
    #: train greedily instead of nightly).
    config_model: ClassVar[type[PolicyConfig]]
    #: True when the policy decides itself when a growing learner grows; ``policy.grow_every: 0``
    #: still turns growth off. Otherwise growth follows ``policy.grow_every`` (:meth:`train_decision`).
    decides_growth: ClassVar[bool] = False

    def __init__(self, config: PolicyConfig):
        self.config = config

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        """Keys of :attr:`config_model` (without ``name``) that tests/test_policy_contract.py runs."""
        return [{}]

    @abstractmethod
    def decide(self, state: PolicyState) -> Decision:
        """Train now on the pending chunks, or wait?"""

    def decide_within_bounds(self, state: PolicyState) -> Decision:
        """:meth:`decide`, with the freshness bound honoured: a wait that would leave the model older
        than ``policy.max_model_age_chunks`` / ``_examples`` / ``_seconds`` becomes a stage
        (:meth:`forced_stage`) whose reason names the bound. The engine asks this, never :meth:`decide`."""
        decision = self.decide(state)
        if decision.trains:
            return decision
        overdue = self.overdue(state)
        if overdue is None:
            return decision
        return self.forced_stage(state, f"{overdue}; the policy would have waited: {decision.reason}")

    def overdue(self, state: PolicyState) -> str | None:
        """Why the freshness bound forces a stage now, or None. Nothing pending, nothing to train on."""
        if state.chunks_pending == 0:
            return None
        chunks, seconds = self.config.max_model_age_chunks, self.config.max_model_age_seconds
        examples = self.config.max_model_age_examples
        if chunks is not None and state.model_age_chunks >= chunks:
            return (
                f"freshness bound: {state.model_age_chunks} chunk(s) since the last stage >= "
                f"policy.max_model_age_chunks={chunks}"
            )
        if examples is not None and state.examples_pending >= examples:
            return (
                f"freshness bound: {state.examples_pending} example(s) since the last stage >= "
                f"policy.max_model_age_examples={examples}"
            )
        if seconds is not None and state.model_age_seconds >= seconds:
            return (
                f"freshness bound: {state.model_age_seconds:.0f} s since the last stage >= "
                f"policy.max_model_age_seconds={seconds:g}"
            )
        return None

    def forced_stage(self, state: PolicyState, reason: str) -> Decision:
        """The stage the freshness bound forces. A policy that keeps count of its stages (adaptive)
        overrides it to count this one as its own; growth follows :meth:`train_decision`."""
        return self.train_decision(state, reason)

    def grows_at(self, stage: int) -> bool:
        """Whether training stage ``stage`` (1-based) starts with a growth step (``policy.grow_every``)."""
        every = self.config.grow_every
        return every > 0 and stage % every == 0

    def train_decision(self, state: PolicyState, reason: str) -> Decision:
        stage = state.stages_done + 1
        grow = state.learner_grows and self.grows_at(stage)
        if grow:
            reason += f"; grow at stage {stage} (grow_every={self.config.grow_every})"
        return Decision.grow(reason) if grow else Decision.train(reason)

    def state_dict(self) -> dict[str, Any]:
        """Internal state to persist across daemon restarts (JSON-able)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (stateless policies need not override it)
        """Restore what :meth:`state_dict` returned."""
