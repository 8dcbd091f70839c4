"""adaptive: decide when to train (and grow) from what the live service measures on each new chunk.

Three rules, checked on every new chunk, with one configuration for every stream (docs/policies.md
explains the reasoning and shows the benchmark):

1. **A growing wait.** Train once the pending chunks reach ``max(1, 0.5 x chunks trained on)``, the
   ``geometric`` policy's rule: under a power-law learning curve the value of one more chunk falls
   with the data already trained on, so the wait grows in proportion to it. The count starts again
   at a detected drift, because the data before it no longer describes the stream.
2. **Drift trains at once.** A new chunk whose error is at least 0.1 above the live model's (and 4
   standard errors) means the stream changed: train now on what is pending, and start the growing
   wait again from that chunk, so that the first stages after it come quickly. That is the default
   ``policy.drift_detector: threshold``; ``page_hinkley`` and ``adwin`` (River's sequential tests,
   policies/drift_detectors.py) add up smaller rises over chunks to see drifts of a few points.
3. **Growth where it pays.** A learner whose growth step keeps the function it computes (gMoE's
   split, Firefly's small steps, the Switch LM's copied experts) grows at every stage: the step costs
   no error and the next stages fill the new capacity. A learner whose growth adds an untrained part
   (gEns's new member, trained from then on alone) grows each time the chunks trained on reach 4 x
   those trained on when its newest part was added: its size grows with the log of the data, as the
   wait grows with the data. No live measure told when a fresh member would pay (the stage gains on
   which an earlier version grew are mostly below the noise); the factor was chosen on twelve seeds
   and checked on twelve others (docs/policies.md). ``policy.grow_every: 0`` turns growth off.

(docs/policies.md also tells of two rules that were tried and dropped: doubling the wait after a stage
with no measurable effect, and growing gEns after two such stages in a row.)

The rules run on the task's measure (``task.measure``) as a loss (policies/measure_scale.py): an error
rate, log-loss or squared error as it is, a recall or PR-AUC as its shortfall from 1, with a binomial
standard error for rates and the measured spread for mean losses.
For language models the same rules run on the log of the perplexity (a rise of 0.1 is about 10 %),
with a standard error of 1 % of the perplexity, since a chunk's tokens are not independent draws.
The policy never reads the clock or the stream's length, so a replay and a live stream of unknown
length decide alike. Its counts and error sums are its persisted state.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import PolicyConfig
from alma_daemon.config.base import PLUGIN_SECTION
from policies.base import Decision, Policy, PolicyState
from policies.drift_detectors import Rise, build_detector
from policies.geometric import DEFAULT_RATIO, geometric_threshold
from policies.measure_scale import ChunkMeasures, MeasureScale

#: The growing wait: train once the pending chunks reach RATIO x the chunks trained on since the last drift.
RATIO = DEFAULT_RATIO
#: A stage had a measurable effect, as the reasons say, when the live model's error is this many standard
#: errors away from the previous model's (below: it paid off; above: it made the model worse).
GAIN_SIGNIFICANCE = 1.0
#: A learner whose growth adds an untrained part grows once the chunks trained on reach this many
#: times those trained on when its newest part was added.
GROWTH_FACTOR = 4


@dataclass(config=PLUGIN_SECTION)
class AdaptiveConfig(PolicyConfig):
    """adaptive: one configuration for every stream (policy.grow_every: 0 still turns growth off); the
    drift detector is its one choice."""

    name: Literal["adaptive"] = "adaptive"
    drift_detector: Literal["threshold", "page_hinkley", "adwin"] = Field(
        default="threshold",
        description='adaptive: what tells a drift from the new chunks\' errors (policies/drift_detectors.py): "threshold" '
        '(one chunk 0.1 and 4 standard errors above the live model), "page_hinkley" or "adwin" (River\'s sequential '
        "tests, which see rises of a few points over chunks; pip install alma-daemon[river]).",
    )


class Adaptive(Policy):
    """Waits a number of chunks that grows with the data trained on; trains at once when the newest
    chunk's error jumps (a drift); grows at every stage where growth keeps the function, else each
    time the data trained on grows 4-fold.

    A policy built on these rules (``forecast`` is one) subclasses it and overrides only these public
    methods, each given what it needs, never the rules' own state:

    - :meth:`wait_ratio`: the growing wait's ratio;
    - :meth:`stage_pays`: whether a stage the wait allows is worth its compute;
    - :meth:`stage_closed`: a stage replaced the live model (its chunks trained on and measures);
    - :meth:`regime_started`: a drift restarted the count.

    ``scale`` (:class:`~policies.measure_scale.MeasureScale`) is the task's measure as the rules read
    it; ``self.live``, ``self.trained`` and ``self.curve``-like state of its own are the subclass's to read.
    """

    name = "adaptive"
    config_model: ClassVar[type[PolicyConfig]] = AdaptiveConfig
    decides_growth = True

    def __init__(self, config: AdaptiveConfig):
        super().__init__(config)
        #: chunks_seen at the last new chunk counted, so that a check between chunks counts nothing twice.
        self.seen = 0
        #: Chunks trained on since the start of the stream or the last drift.
        self.trained = 0
        #: The id of the chunk the current regime started at: None from the stream's start, else the drifted chunk.
        self.regime_start: int | None = None
        self.live = ChunkMeasures()
        self.previous: ChunkMeasures | None = None
        #: Whether a drift triggered the last stage (None before the first stage).
        self.last_stage_drifted: bool | None = None
        #: Chunks trained on (counted as ``trained``) when the newest part of a growing learner was added.
        self.grown_from = 0
        self.detector = build_detector(config.drift_detector)

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        return [{}, {"drift_detector": "page_hinkley"}, {"drift_detector": "adwin"}]

    # -- persistence ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "seen": self.seen,
            "trained": self.trained,
            "regime_start": self.regime_start,
            "live": self.live.to_dict(),
            "previous": self.previous.to_dict() if self.previous else None,
            "last_stage_drifted": self.last_stage_drifted,
            "grown_from": self.grown_from,
            "drift_detector": self.detector.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = int(state.get("seen", 0))
        self.trained = int(state.get("trained", 0))
        start = state.get("regime_start")
        self.regime_start = None if start is None else int(start)
        self.live = ChunkMeasures(state.get("live"))
        self.previous = ChunkMeasures(state["previous"]) if state.get("previous") else None
        self.last_stage_drifted = state.get("last_stage_drifted")
        self.grown_from = int(state.get("grown_from", 0))
        self.detector.load_state_dict(state.get("drift_detector") or {})

    # -- the decision -----------------------------------------------------------------------------
    def decide(self, state: PolicyState) -> Decision:
        if state.prequential is None or state.chunks_seen <= self.seen:
            return Decision.wait(
                f"{state.chunks_pending} chunk(s) pending; no new chunk measured since the "
                f"last decision (this policy decides on new chunks)",
            )
        self.seen = state.chunks_seen
        kind = state.measure
        scale = MeasureScale(kind)
        estimates: dict[str, float] = {}
        # A NaN or infinite measure (a diverged language model, a chunk with no tokens) says nothing
        # about the stream: it is left out of the means and of the drift test, and the wait goes on.
        usable = math.isfinite(state.prequential)
        value = scale.value(state.prequential) if usable else math.nan
        unit_variance = scale.unit_variance(state.prequential_unit_variance)
        drift_reason = (
            self._drift(value, state.prequential_examples, unit_variance, scale, estimates) if usable else None
        )
        if usable:
            self.live.add(value, state.prequential_examples, unit_variance)
        if drift_reason is not None:
            return self._train(state, drift_reason, estimates, value, drift=True)

        threshold = self._threshold(scale)
        since = "the stream's start" if self.regime_start is None else f"chunk {self.regime_start}"
        rule = f"max(1, {self.wait_ratio(scale):.3g} x {self.trained} chunk(s) trained on since {since}) = {threshold}"
        gain = self._stage_gain(scale, estimates)
        self._export_means(kind, estimates)
        estimates["wait_chunks"] = float(threshold)
        pending = state.chunks_pending
        if self.live.chunks:
            facts = f"live model {scale.shown(self.live.mean)} on {self.live.chunks} chunk(s){gain}"
        else:
            facts = "no finite measure of the live model yet"
        if not usable:
            facts += f"; the newest chunk's {kind} ({state.prequential}) is not finite and was left out"
        if pending >= threshold:
            reason = f"{pending} chunk(s) pending >= {rule}; {facts}"
            pays, priced = self.stage_pays(state, scale, estimates)
            reason = f"{reason}; {priced}" if priced else reason
            if not pays:
                return Decision.wait(reason, estimates)
            return self._train(state, reason, estimates, value, drift=False)
        return Decision.wait(f"{pending} chunk(s) pending < {rule}; {facts}", estimates)

    def forced_stage(self, state: PolicyState, reason: str) -> Decision:
        # A stage like one the growing wait allows: the live model is replaced and its chunks counted.
        return self._train(state, reason, {}, math.nan, drift=False)

    # -- what a policy built on these rules may change (forecast does): see the class docstring -----
    def wait_ratio(self, scale: MeasureScale) -> float:
        """The growing wait's ratio: pending chunks per chunk trained on since the regime started."""
        return RATIO

    def stage_pays(self, state: PolicyState, scale: MeasureScale, estimates: dict[str, float]) -> tuple[bool, str]:
        """Whether a stage that the growing wait allows is worth its compute, and why (text for the
        reason; empty: nothing to add). ``estimates`` takes the numbers it decided from."""
        return True, ""

    def stage_closed(self, trained: int, live: ChunkMeasures, scale: MeasureScale) -> None:
        """A stage (not for a drift) replaces the live model, which was trained on ``trained`` chunks since
        the regime started and measured ``live`` on the chunks it met."""

    def regime_started(self) -> None:
        """A drift: what was learned about the stream before it no longer holds."""

    def _threshold(self, scale: MeasureScale) -> int:
        """Pending chunks the next stage waits for."""
        return geometric_threshold(self.wait_ratio(scale), self.trained)

    def _export_means(self, kind: str, estimates: dict[str, float]) -> None:
        """The live and previous models' mean errors, as estimates (error rates only; NaN where none)."""
        if kind == "error":
            estimates["live_error"] = self.live.mean if self.live.chunks else math.nan
            estimates["previous_error"] = self.previous.mean if self.previous and self.previous.chunks else math.nan

    def _drift(
        self, value: float, examples: int, unit_variance: float | None, scale: MeasureScale, estimates: dict[str, float]
    ) -> str | None:
        """Why the newest chunk signals a drift, or None. It is compared with the live model's errors
        so far, or right after a stage (none yet) with the previous model's."""
        reference = self.live if self.live.chunks else self.previous
        if reference is None or not reference.chunks:
            return None
        jump = value - reference.mean
        spread = math.sqrt(scale.variance(value, examples, unit_variance) + reference.variance(scale))
        score = jump / spread
        estimates["drift_score"] = score
        if reference is not self.live and not self.detector.reads_stage_changes:
            return None
        if not self.detector.update(Rise(jump, score)):
            return None
        whose = "live model's" if reference is self.live else "model before the last stage's"
        reason = (
            f"drift: the newest chunk's {scale.shown(value)} is {scale.worse_by(jump)} the {whose} "
            f"{scale.shown(reference.mean)} ({score:.1f} standard errors)"
        )
        if reference is not self.live:
            # The first chunk after a stage is the live model's first measure: a stage that made the
            # model worse and a changed stream look alike on it, and both call for training again.
            reason += " (or the last stage made the model worse: on the first chunk after a stage the two look alike)"
        why = self.detector.why()
        return f"{reason}; {why}" if why else reason

    def _stage_gain(self, scale: MeasureScale, estimates: dict[str, float]) -> str:
        """The last stage's measured gain, as text for the reason."""
        if self.previous is None or self.last_stage_drifted is not False:
            return ""
        if not (self.previous.chunks and self.live.chunks):
            return ""
        gain = self.previous.mean - self.live.mean
        spread = math.sqrt(self.previous.variance(scale) + self.live.variance(scale))
        score = gain / spread
        estimates["stage_gain_score"] = score
        if abs(score) < GAIN_SIGNIFICANCE:
            verdict = "no measurable effect"
        else:
            verdict = "paid off" if score > 0 else "made it worse"
        gained = scale.gained(gain)
        text = (
            f", previous model {scale.shown(self.previous.mean)}: the last stage gained {gained} "
            f"({score:.1f} standard errors: {verdict})"
        )
        return text

    def _train(
        self, state: PolicyState, reason: str, estimates: dict[str, float], value: float, *, drift: bool
    ) -> Decision:
        scale = MeasureScale(state.measure)
        pending = state.chunks_pending
        trained_before = self.trained
        if drift:
            newest = state.newest_chunk if state.newest_chunk is not None else state.chunks_seen
            self.regime_start = newest
            self.detector.reset()
            self.regime_started()
            # Only the newest chunk comes from the new distribution; the old model's error on it is
            # what the next stage must improve on.
            self.trained = 1
            self.grown_from = 0
            trained_before = 0
            self.previous = ChunkMeasures()
            self.previous.add(value, state.prequential_examples, scale.unit_variance(state.prequential_unit_variance))
            reason += f"; training now on {pending} pending chunk(s) and waiting again from chunk {newest}"
        else:
            self.stage_closed(self.trained, self.live, scale)
            self.trained += pending
            # A live model with no finite measure tells nothing: the one before it stays the reference.
            if self.live.chunks or self.previous is None:
                self.previous = self.live
        grow = False
        if state.learner_grows and self.config.grow_every > 0:
            if state.growth_keeps_function:
                grow = True
                reason += "; grow first: the learner's growth keeps its function, so new capacity costs no error"
            elif trained_before >= GROWTH_FACTOR * max(1, self.grown_from):
                grow = True
                reason += (
                    f"; grow first: {trained_before} chunk(s) trained on >= {GROWTH_FACTOR} x max(1, "
                    f"{self.grown_from} chunk(s) trained on when the newest part was added): a new part each "
                    f"time the data grows {GROWTH_FACTOR}-fold"
                )
                self.grown_from = trained_before
        self.live = ChunkMeasures()
        self.last_stage_drifted = drift
        # The estimates describe the state after the decision, which the gauges show until the next
        # chunk: a new live model with nothing measured yet, the replaced one as the previous, the
        # next wait. The drift score stays: it is the newest chunk's.
        after = {"drift_score": estimates["drift_score"]} if "drift_score" in estimates else {}
        self._export_means(state.measure, after)
        after["wait_chunks"] = float(self._threshold(scale))
        return (Decision.grow if grow else Decision.train)(reason, after)
