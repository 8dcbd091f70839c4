"""What a team's stage trains, validates and decides on: the pooled validation set, the class-aware
replay set and a binary task's decision (docs/policies.md, "What a stage trains on").

The paper's stage fine-tunes on the pending chunks and stops early on their 10 %; a team's chunks are
small and imbalanced. :class:`TeamStage` holds the two example reservoirs (core/example_reservoir.py)
the engine's stages read and leave, saves them with each model version and restores them from it, and
chooses a binary task's calibration and threshold after each stage (alma_daemon/measures/decision.py).
Where the stream changed (the newest chunks' loss well above the pooled validation set's under the model
that served them), the old examples would teach and judge a rule that left: both reservoirs restart from
the new chunks, and that stage trains and validates on them alone. With the paper's recipe (``StageRecipe``
keeping nothing and pooling nothing) it changes nothing.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import torch

from alma_daemon.config import Config
from alma_daemon.config.sections import StageRecipe
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import StageData
from alma_daemon.core.example_reservoir import ExampleReservoir, proportional_quotas
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.measures import target_of
from alma_daemon.measures.classification import LogLoss
from alma_daemon.measures.decision import (
    THRESHOLD_DECISIONS,
    calibrated,
    choose_threshold,
    fit_calibration,
    prior_calibration,
)
from alma_daemon.training.validated import mean_with_error

log = logging.getLogger(__name__)

#: The stream changed (:meth:`TeamStage.changed`) where the new chunks' loss is above the pooled validation
#: set's by more than this many standard errors of the difference: rare by chance on a still stream.
CHANGE_Z = 3.0

#: A pooled validation set decides when a stage stops from this many examples (a binary task: positives)
#: on; with fewer, one mistake more or less moves the measure more than an epoch does.
MIN_STOPPING_EXAMPLES = 50
MIN_STOPPING_POSITIVES = 10
#: A stage validates on at least this many of the pooled validation set's newest examples.
MIN_STAGE_VALIDATION = 200
#: The replay set keeps each class's share of the stream, with no floor: a floor kept old frauds that
#: taught a rule the fraudsters had left (benchmarks/bench_fraud.py, tuned on history seed 0).
REPLAY_QUOTAS = proportional_quotas(0)


@dataclass(frozen=True)
class StageExamples:
    """A stage's examples and the reservoirs it leaves once it trained (:meth:`TeamStage.examples`)."""

    train: LabeledData
    val: LabeledData
    pool: ExampleReservoir | None
    replay: ExampleReservoir | None
    #: Whether the stage replays and validates on the reservoirs, or on its own chunks alone.
    pooled: bool
    #: Whether the stream had changed, so that the reservoirs restarted from the stage's new chunks.
    restarted: bool = False
    #: Examples the served model predicted to tell whether the stream changed (the stage's compute).
    scored: int = 0


def example_losses(learner: Learner, data: LabeledData) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's loss under ``learner`` and its weight: a classifier's log-loss weighted by
    ``task.class_weights`` (a decision's error on a few positives is too coarse to compare models by), a
    regression's measure (none where the measure has no per-example value)."""
    task, outputs, y = learner.task, learner.outputs(data), data.y.cpu()
    if task.kind != "classification":
        measured = learner.task_measure.per_example(outputs, y)
        if measured is None:
            return torch.zeros(0), torch.zeros(0)
        losses, counted = measured
        return losses, counted.double()
    losses, _ = LogLoss(target_of(task)).per_example(outputs, y.long())
    weights = torch.tensor(task.class_weights or [1.0] * task.num_classes, dtype=torch.float64)[y.long()]
    return losses, weights


class TeamStage:
    """The reservoirs a team's stages share, and the decision each stage leaves (module docstring)."""

    def __init__(self, recipe: StageRecipe, config: Config):
        self.recipe = recipe
        self.config = config
        #: The pooled validation set and the replay set as the last stage left them (None before it, or
        #: where the recipe keeps none).
        self.validation_pool: ExampleReservoir | None = None
        self.replay_reservoir: ExampleReservoir | None = None
        #: Topics already warned of once this stream (too few to stop early, a decision target not met).
        self._said: set[str] = set()

    def examples(self, data: StageData, learner: Learner, cap: int | None) -> StageExamples:
        """(train, validation) of a stage and the reservoirs it leaves: the pooled validation set offered
        the new chunks' held-out share, the stage validating on its newest part; the replay set adds as
        many of its examples as the stage has new ones (within the stage cap ``cap``), then is offered
        them. Both keep the stream's class mix (stratified, so a rare class is never sampled away), the
        validation set with a floor of ``serving.promotion_min_positives`` of each class (the guard's
        minimum) where the stream has had them. Where the stream changed (:meth:`changed`), both restart
        from the new chunks, and the stage trains and validates on them alone."""
        recipe, seed = self.recipe, self.config.stream.seed
        train, val = data.train, data.val
        task = learner.task
        strata = task.num_classes if task.kind == "classification" else 1
        pool, replay = self.validation_pool, self.replay_reservoir
        pooled = bool(recipe.validation_examples or recipe.keep == "classes")
        restarted, scored = False, 0
        if pooled and self.config.stream.reservoir_reset:
            restarted, scored = self.changed(data, learner)
        if restarted:
            pool = replay = None
            pooled = False
        if recipe.validation_examples:
            quotas = proportional_quotas(self.config.serving.promotion_min_positives)
            pool = (pool or ExampleReservoir.empty(train, strata)).offered_splits(
                data.fresh, "val", seed, recipe.validation_examples, quotas, recipe.half_life
            )
            # The stage reads the newest of the pool (its ranks favour recent chunks): as many as its own
            # chunks hold out, at least MIN_STAGE_VALIDATION, reaching further back only for the positives
            # early stopping needs. Further back is the guard's: on a moving stream (a new fraud rule) old
            # examples would stop a stage before it learns what holds now.
            if pooled:
                wanted = max(len(data.val), MIN_STAGE_VALIDATION)
                val = pool.sample(wanted, proportional_quotas(MIN_STOPPING_POSITIVES))
        if recipe.keep == "classes":
            assert recipe.replay_examples is not None  # StreamConfig.recipe
            replay = replay or ExampleReservoir.empty(train, strata)
            room = self.replay_room(len(train))
            if cap is not None:
                room = min(room, max(0, cap - len(data.train) - len(data.val)))
            if pooled and room and len(replay):
                train = LabeledData.concat([train, replay.sample(room, REPLAY_QUOTAS)])
            replay = replay.offered_splits(
                data.fresh, "train", seed, recipe.replay_examples, REPLAY_QUOTAS, recipe.half_life
            )
        return StageExamples(train, val, pool, replay, pooled, restarted, scored)

    def trained(self, examples: StageExamples) -> None:
        """The stage of ``examples`` trained: its reservoirs are the ones later stages read."""
        self.validation_pool, self.replay_reservoir = examples.pool, examples.replay

    def changed(self, data: StageData, learner: Learner) -> tuple[bool, int]:
        """Whether the stream changed since the pooled validation set was drawn, and the examples scored
        to tell: the loss of the model that served the stage's new chunks (class-weighted log-loss, or the
        regression's measure per example) is above its loss on the pool, weighted back to the stream's
        class mix, by more than :data:`CHANGE_Z` standard errors of the difference. Neither was trained on."""
        pool = self.validation_pool
        if pool is None or len(pool) < MIN_STOPPING_EXAMPLES or not data.fresh:
            return False, 0
        fresh = LabeledData.concat([part for chunk in data.fresh for part in (chunk.train, chunk.val)])
        now = mean_with_error(*example_losses(learner, fresh))
        losses, weights = example_losses(learner, pool.data)
        before = mean_with_error(losses, weights * pool.stream_weights(pool.data.y))
        scored = len(fresh) + len(pool)
        spread = math.hypot(now.standard_error, before.standard_error)
        if not spread > 0 or (now - before) / spread <= CHANGE_Z:
            return False, scored
        self._say(
            "change",
            f"the stream changed: the served model's loss on the {len(fresh)} new examples ({now:.4g}) is above "
            f"its loss on the pooled validation set ({before:.4g}) by {(now - before) / spread:.1f} standard "
            "errors; the replay and validation sets restart from the new chunks, which this stage trains on "
            "alone (stream.reservoir_reset)",
        )
        return True, scored

    def replay_room(self, new_examples: int) -> int:
        """The replayed examples a stage of ``new_examples`` asks for: as many, or up to
        ``stream.stage_examples`` in all."""
        return max(new_examples, (self.recipe.stage_examples or 0) - new_examples)

    def replayed_examples(self, pending_train_examples: int) -> int:
        """The replayed examples the next stage adds to its ``pending_train_examples``, about."""
        held = len(self.replay_reservoir) if self.replay_reservoir is not None else 0
        return min(held, self.replay_room(pending_train_examples))

    def stops_early(self, stage: int, examples: StageExamples, learner: Learner) -> bool:
        """Whether a stage validating on the pooled validation set has enough of it to decide when to stop;
        with too few examples (or positives) it trains every one of ``train.epochs`` epochs and keeps the last."""
        val = examples.val
        if not (self.recipe.validation_examples and examples.pooled):
            return True
        task = learner.task
        if task.target_kind == "binary":
            held, needed, what = int((val.y == task.positive).sum()), MIN_STOPPING_POSITIVES, "positives"
        else:
            held, needed, what = len(val), MIN_STOPPING_EXAMPLES, "examples"
        if held >= needed:
            return True
        self._say(
            "stopping",
            f"stage {stage}: the pooled validation set holds {held} {what}, too few to decide when to stop "
            f"(from {needed}): the stage trains all train.epochs={self.config.train.epochs} epochs and keeps the last",
        )
        return False

    def choose_decision(self, learner: Learner, examples: StageExamples) -> None:
        """A binary task's decision for the version a stage made: its probabilities calibrated on the
        stage's validation set (a pooled one weighted back to the stream's class mix) and the threshold its
        ``task.decision`` asks for, both into the learner's task (alma_daemon/measures/decision.py)."""
        task, val = learner.task, examples.val
        if task.target_kind != "binary" or task.decision not in THRESHOLD_DECISIONS:
            return
        positives = val.y == task.positive
        if not bool(positives.any()):
            self._say("decision", "the validation set holds no positive yet: the decision stays as it was")
            return
        learner.task = replace(task, calibration=None, threshold=None)
        raw = learner.outputs(val)
        pool = examples.pool
        weights = pool.stream_weights(val.y) if pool is not None and examples.pooled else torch.ones(len(val))
        prior = prior_calibration(task.class_weights, task.positive)
        calibration = fit_calibration(raw, positives, weights, task.positive, prior) or prior
        probabilities = calibrated(raw, calibration, task.positive)[:, task.positive]
        choice = choose_threshold(
            task.decision,
            task.decision_target,
            probabilities,
            positives,
            weights,
            task.false_negative_cost,
            task.false_positive_cost,
        )
        if not choice.met:
            self._say(
                "decision target",
                f"task.decision_target: no threshold meets a {task.decision} of {task.decision_target:g} on the "
                f"validation set (at best {choice.reached:.3g}): the threshold nearest to it is used",
            )
        learner.task = replace(task, calibration=calibration, threshold=choice.threshold)

    def tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """The reservoirs a checkpoint saves, by name (``CheckpointStore.save``'s ``reservoirs``)."""
        return {
            name: reservoir.tensors()
            for name, reservoir in (("validation", self.validation_pool), ("replay", self.replay_reservoir))
            if reservoir is not None and len(reservoir)
        }

    def restore(self, checkpoints: CheckpointStore, version: int) -> None:
        """The reservoirs as the stage of ``version`` left them."""
        pool, replay = (checkpoints.reservoir(version, name) for name in ("validation", "replay"))
        if self.recipe.validation_examples and pool is not None:
            self.validation_pool = ExampleReservoir.from_tensors(pool)
        if self.recipe.keep == "classes" and replay is not None:
            self.replay_reservoir = ExampleReservoir.from_tensors(replay)

    def say_unfilled_pool(self, chunks_seen: int) -> None:
        """At a finite stream's end (a backtest): a pooled validation set the stream never filled is said,
        as only the stream could tell."""
        wanted, pool = self.recipe.validation_examples, self.validation_pool
        if not wanted or pool is None or len(pool) >= wanted:
            return
        log.warning(
            f"stream.validation_examples={wanted} is more than the {len(pool)} examples this stream's "
            f"{chunks_seen} chunks held out (stream.val_fraction={self.config.stream.val_fraction:g}): "
            "the pooled validation set never filled; lower it to what a stage can use"
        )

    def _say(self, topic: str, message: str) -> None:
        """``message`` as a warning the first time of ``topic`` in a stream, then at info level."""
        log.log(logging.INFO if topic in self._said else logging.WARNING, message)
        self._said.add(topic)
