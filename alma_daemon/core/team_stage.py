"""What a team's stage trains, validates and decides on: the pooled validation set, the class-aware
replay set and a binary task's decision (docs/policies.md, "What a stage trains on").

The paper's stage fine-tunes on the pending chunks and stops early on their 10 %; a team's chunks are
small and imbalanced. :class:`TeamStage` holds the two example reservoirs (core/example_reservoir.py)
the engine's stages read and leave, saves them with each model version and restores them from it, and
chooses a binary task's calibration and threshold after each stage (alma_daemon/measures/decision.py).
With the paper's recipe (``StageRecipe`` keeping nothing and pooling nothing) it changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from alma_daemon.config import Config
from alma_daemon.config.sections import StageRecipe
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import StageData
from alma_daemon.core.example_reservoir import ExampleReservoir, proportional_quotas
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.measures.decision import (
    THRESHOLD_DECISIONS,
    calibrated,
    choose_threshold,
    fit_calibration,
    prior_calibration,
)

log = logging.getLogger(__name__)

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
        minimum) where the stream has had them."""
        recipe, seed = self.recipe, self.config.stream.seed
        train, val = data.train, data.val
        task = learner.task
        strata = task.num_classes if task.kind == "classification" else 1
        pool = self.validation_pool
        if recipe.validation_examples:
            quotas = proportional_quotas(self.config.serving.promotion_min_positives)
            pool = (pool or ExampleReservoir.empty(train, strata)).offered_splits(
                data.fresh, "val", seed, recipe.validation_examples, quotas, recipe.half_life
            )
            # The stage reads the newest of the pool (its ranks favour recent chunks): as many as its own
            # chunks hold out, at least MIN_STAGE_VALIDATION, reaching further back only for the positives
            # early stopping needs. Further back is the guard's: on a moving stream (a new fraud rule) old
            # examples would stop a stage before it learns what holds now.
            wanted = max(len(data.val), MIN_STAGE_VALIDATION)
            val = pool.sample(wanted, proportional_quotas(MIN_STOPPING_POSITIVES))
        replay = self.replay_reservoir
        if recipe.keep == "classes":
            assert recipe.replay_examples is not None  # StreamConfig.recipe
            replay = replay or ExampleReservoir.empty(train, strata)
            room = len(train)
            if cap is not None:
                room = min(room, max(0, cap - len(data.train) - len(data.val)))
            if room and len(replay):
                train = LabeledData.concat([train, replay.sample(room, REPLAY_QUOTAS)])
            replay = replay.offered_splits(
                data.fresh, "train", seed, recipe.replay_examples, REPLAY_QUOTAS, recipe.half_life
            )
        return StageExamples(train, val, pool, replay)

    def trained(self, examples: StageExamples) -> None:
        """The stage of ``examples`` trained: its reservoirs are the ones later stages read."""
        self.validation_pool, self.replay_reservoir = examples.pool, examples.replay

    def replayed_examples(self, pending_train_examples: int) -> int:
        """The replayed examples the next stage adds to its ``pending_train_examples``, about."""
        held = len(self.replay_reservoir) if self.replay_reservoir is not None else 0
        return min(held, pending_train_examples)

    def stops_early(self, stage: int, val: LabeledData, learner: Learner) -> bool:
        """Whether a stage with a pooled validation set has enough of it to decide when to stop; with too
        few examples (or positives) it trains every one of ``train.epochs`` epochs and keeps the last."""
        if not self.recipe.validation_examples:
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

    def choose_decision(self, learner: Learner, val: LabeledData) -> None:
        """A binary task's decision for the version a stage made: its probabilities calibrated on the
        stage's validation set (weighted back to the stream's class mix) and the threshold its
        ``task.decision`` asks for, both into the learner's task (alma_daemon/measures/decision.py)."""
        task = learner.task
        if task.target_kind != "binary" or task.decision not in THRESHOLD_DECISIONS:
            return
        positives = val.y == task.positive
        if not bool(positives.any()):
            self._say("decision", "the validation set holds no positive yet: the decision stays as it was")
            return
        learner.task = replace(task, calibration=None, threshold=None)
        raw = learner.outputs(val)
        pool = self.validation_pool
        weights = pool.stream_weights(val.y) if pool is not None else torch.ones(len(val))
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
