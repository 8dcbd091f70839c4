"""The ALMA engine (Algorithm 1): the single code path behind ``alma simulate`` and ``alma run``.

For every chunk that arrives, :meth:`Engine.on_chunk`

1. records the prequential measure: the current model on the new chunk, before training on it;
2. splits off the chunk's validation share and buffers it;
3. asks the policy whether to train now (and whether to grow first);
4. trains (grows, fine-tunes or retrains from scratch) on the buffered data, counting FLOPs;
5. writes a checkpoint, which observers may publish;
6. evaluates on the test set, when there is one, and hands the step's record to observers.

Chunks may come from any source; only the buffer and the observers differ between the simulator
and the daemon. All randomness of stage k derives from (seed, k), so a resumed run equals an
uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from alma_daemon.config import Config, ConfigError
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import ChunkBuffer
from alma_daemon.core.engine_state import EngineState
from alma_daemon.core.records import CUMULATIVE_MEASURES, StageRecord, StepRecord
from alma_daemon.core.reference import ReferenceLearner
from alma_daemon.core.stage_plan import StagePlan
from alma_daemon.core.team_stage import StageExamples, TeamStage, example_losses
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.streams import Chunk, build_drift, prequential_sample, split_chunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.measures import Measure, Measurement
from alma_daemon.measures.decision import RELIABILITY_EDGES, reliability
from alma_daemon.seeding import derive_seed
from alma_daemon.training.loop import FitReport, Trainer
from alma_daemon.training.optim import resolve_optimizer_name
from alma_daemon.training.validated import mean_with_error
from policies import Decision, Policy, PolicyState

log = logging.getLogger(__name__)


class EngineObserver:
    """Hook points around the engine's steps (progress bars, results files, metrics, publishers).

    Every method has a no-op default; an observer overrides what it needs and never mutates the engine.
    """

    def on_decision(self, decision: Decision, engine: Engine) -> None: ...

    def on_stage(self, stage: StageRecord, engine: Engine) -> None: ...

    def on_checkpoint(self, version: int, path: str, metrics: dict[str, Any], engine: Engine) -> None: ...

    def on_step(self, record: StepRecord, engine: Engine) -> None: ...

    def on_tick_stage(self, stage: StageRecord, engine: Engine) -> None:
        """A stage trained between chunks (:meth:`Engine.on_tick`), its cost already in the running
        totals; no step record reports it before the next chunk."""


class Engine:
    """Drives a learner through a stream of chunks under a waiting-time policy."""

    #: The reference learner measured and taught beside the network on each chunk (reference.kind); set by
    #: :func:`~alma_daemon.core.assembly.assemble_engine`, None for an engine without one.
    reference: ReferenceLearner | None = None

    def __init__(
        self,
        learner: Learner,
        policy: Policy,
        buffer: ChunkBuffer,
        config: Config,
        device: torch.device,
        *,
        test_set: LabeledData | None = None,
        checkpoints: CheckpointStore | None = None,
        observers: list[EngineObserver] | tuple[EngineObserver, ...] = (),
        state: EngineState | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if config.train.linear_candidate and learner.linear_architecture is None:
            raise ConfigError(
                f"train.linear_candidate: learner {learner.name!r} has no linear form to train beside its network; "
                "use learner sm, or set it to false"
            )
        if config.train.linear_candidate and config.train.from_scratch:
            raise ConfigError(
                "train.linear_candidate: a stage of train.from_scratch trains no candidate beside it; set one of the "
                "two to false"
            )
        self.learner = learner.to(device)
        self.policy = policy
        self.buffer = buffer
        self.config = config
        self.device = device
        self.test_set = test_set
        self.checkpoints = checkpoints
        self.observers = list(observers)
        self.state = state or EngineState(started_at=clock())
        self.clock = clock
        self.optimizer_name = resolve_optimizer_name(config.train, config.dataset.name)
        #: What a stage trains and validates on: the task's defaults applied (docs/policies.md).
        self.recipe = config.stream.recipe(learner.task.is_team_task)
        self.stage_plan = StagePlan.from_config(config, self.recipe)
        #: The pooled validation set and the replay set of a team's task, and its decision (team_stage.py).
        self.team = TeamStage(self.recipe, config)
        #: The caps already named as smaller than a chunk (:meth:`_check_caps`).
        self._caps_named: set[str] = set()
        # A drifting stream (stream.drift) changes the test set from the first drifted chunk on, as the
        # source changes the chunks, so that CER measures the distribution the chunks come from.
        self.drift = build_drift(config.stream.drift, learner.task, config.stream.seed)
        #: (drift amount, the test set drifted by it): a gradual drift changes it on each chunk of its ramp.
        self._drifted_test_set: tuple[float, LabeledData] | None = None
        #: (model version, test set, (measure, other measures)) of the last test-set measurement: see :meth:`test_measure`.
        self._last_test: tuple[int, LabeledData, tuple[float, dict[str, float]]] | None = None
        #: (test set, the input-blind model's measure on it), recorded when :attr:`records_baseline`.
        self._test_baseline: tuple[LabeledData, float] | None = None

    # -- the step ---------------------------------------------------------------------------------
    def on_chunk(self, chunk: Chunk) -> StepRecord:
        """Process one arriving chunk (steps 1-6 above) and return its record."""
        if chunk.index == self.state.last_chunk:
            raise ValueError(f"chunk {chunk.index} taken twice")
        late = chunk.index < self.state.last_chunk
        if self.learner.awaits_statistics:
            self.learner.take_statistics(chunk.data)
        stream = self.config.stream
        sample = prequential_sample(chunk, stream.prequential_examples, stream.seed)
        prequential, details, outputs = self.learner.assess_outputs(sample)
        reference = None
        if self.reference is not None:
            # Measured on the network's sample before it learns, then taught the whole chunk (core/reference.py).
            reference = self.reference.assess(sample)
            self.reference.learn(chunk.data)
            self.state.reference = self.reference.state_dict()
        self._check_caps(chunk)
        self.buffer.add(split_chunk(chunk, stream.val_fraction, stream.seed))
        self.state.chunks_seen += 1
        self.state.last_chunk = max(chunk.index, self.state.last_chunk)
        self.state.late_chunks += late
        self.state.examples_seen += len(chunk)

        decision = self.decide(prequential)
        stage = self.train_stage(decision) if decision.trains else None
        # With a test set the step records the test set's baseline instead (record_step).
        chunk_baseline = self.records_baseline and self.test_set is None
        baseline = self.task_measure.baseline(sample.y) if chunk_baseline else None
        return self.record_step(
            chunk,
            prequential.value,
            decision,
            stage,
            late=late,
            details=details,
            baseline=baseline,
            reference=reference,
            reliability=self._reliability(outputs, sample),
        )

    def _reliability(self, outputs: torch.Tensor | None, sample: LabeledData) -> list[list[float]] | None:
        """A binary task's reliability on the prequential sample: the probabilities of the positive class
        it was served (calibrated, as the version answers) binned with its positives; None for other tasks."""
        task = self.learner.task
        if task.target_kind != "binary" or outputs is None:
            return None
        bins = reliability(outputs[:, task.positive], sample.y == task.positive, edges=RELIABILITY_EDGES)
        # Counts as integers and sums to 6 places: a row a step, for as long as the stream runs.
        return [[int(n), round(p, 6), int(k)] for n, p, k in bins]

    def _check_caps(self, chunk: Chunk) -> None:
        """A replay set or a stage cap smaller than a chunk is said once, when the first such chunk comes
        (a stream of parts tells its chunks' size only then; an event stream's is checked at start-up):
        the replay set keeps no chunk that large, and a stage trains on a sample of it."""
        examples = len(chunk)
        plan = self.stage_plan
        replay_cap = plan.replay_examples if plan.keep in ("window", "reservoir") else None
        for key, cap, consequence in (
            ("stream.replay_examples", replay_cap, "the replay set keeps no chunk that large"),
            ("train.max_stage_examples", plan.max_stage_examples, "a stage trains on a sample of each"),
        ):
            if cap is None or examples <= cap or key in self._caps_named:
                continue
            self._caps_named.add(key)
            log.warning(
                f"{key}={cap} is smaller than chunk {chunk.index}'s {examples} examples: {consequence}; "
                f"raise it above the chunks' size"
            )

    @property
    def task_measure(self) -> Measure:
        return self.learner.task_measure

    @property
    def records_baseline(self) -> bool:
        """Whether steps record an input-blind model's measure: for a team's task (its own measure, two
        classes, a regression), not for the paper's balanced classes, whose series stay as they were."""
        task = self.learner.task
        return bool(task.measure) or task.target_kind in ("binary", "regression")

    def policy_state(self, prequential: Measurement | None = None) -> PolicyState:
        """What the policy sees; ``prequential`` is the newest chunk's measurement (None between chunks)."""
        pending = self.buffer.pending_examples()
        age_chunks, age_seconds = self.model_age()
        kept = self.stage_plan.stage_examples(pending, self.buffer.kept_examples())
        kept += self.team.replayed_examples(round(pending * (1 - self.config.stream.val_fraction)))
        return PolicyState(
            chunks_seen=self.state.chunks_seen,
            chunks_pending=len(self.buffer.pending_chunks()),
            examples_pending=pending,
            stages_done=self.state.stages_done,
            now=self.clock(),
            started_at=self.state.started_at,
            train_flops_total=self.state.cumulative_train_flops,
            train_seconds_total=self.state.cumulative_train_seconds,
            flops_per_example=self.state.last_stage_flops_per_example,
            train_seconds_per_example=self.state.last_stage_seconds_per_example,
            # The validation share of each chunk is held out from training.
            next_stage_examples=round(kept * (1 - self.config.stream.val_fraction)),
            learner_grows=self.learner.grows and not self.learner.at_size_cap,
            growth_keeps_function=self.learner.growth_keeps_function,
            prequential=prequential.value if prequential is not None else None,
            prequential_examples=prequential.examples if prequential is not None else 0,
            prequential_unit_variance=prequential.unit_variance if prequential is not None else None,
            measure=self.learner.measure,
            newest_chunk=self.state.last_chunk or None,
            model_age_chunks=age_chunks,
            model_age_seconds=age_seconds,
        )

    def model_age(self) -> tuple[int, float]:
        """Chunks arrived and seconds passed since the last stage (since the stream's start before it)."""
        s = self.state
        since = s.last_stage_at if s.last_stage_at is not None else s.started_at
        return s.chunks_seen - s.last_stage_chunks_seen, max(0.0, self.clock() - since)

    def decide(self, prequential: Measurement | None = None) -> Decision:
        """The policy's decision on the newest chunk (or between chunks), the freshness bound honoured."""
        return self._decided(self.policy.decide_within_bounds(self.policy_state(prequential)))

    def _decided(self, decision: Decision) -> Decision:
        self.state.last_decision = {
            "action": decision.action,
            "reason": decision.reason,
            "at": self.clock(),
            "estimates": decision.estimates,
        }
        log.info("policy decision", extra={"action": decision.action, "reason": decision.reason, **decision.estimates})
        for observer in self.observers:
            observer.on_decision(decision, self)
        return decision

    def on_tick(self) -> StageRecord | None:
        """A policy check between chunks (the daemon's scheduler): time-based policies may train now,
        and any policy whose freshness bound in seconds came due with a chunk pending.

        Returns the stage, or None. The stage's FLOPs and seconds are added to the totals here,
        since no step record carries them.
        """
        if self.policy.time_based:
            # Asked even with nothing pending: a fire time that passes without a chunk is used up, so a
            # chunk arriving after it waits for the next one (a nightly schedule's promise).
            decision = self.decide()
        else:
            # Any other policy decides on chunks only; between them only the freshness bound in
            # seconds can come due, and it is checked without asking the policy (nor logging a wait).
            state = self.policy_state()
            overdue = self.policy.overdue(state)
            if overdue is None:
                return None
            decision = self._decided(self.policy.forced_stage(state, overdue))
        if not decision.trains:
            return None
        stage = self.train_stage(decision)
        self.state.cumulative_train_flops += stage.train_flops
        self.state.cumulative_train_seconds += stage.train_seconds
        for observer in self.observers:
            observer.on_tick_stage(stage, self)
        return stage

    def _candidates(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        """The models a stage trains from fresh weights beside the one it fine-tuned, each as (the stage's kind
        if it is kept, its architecture). ``train.scratch_candidate``: the same architecture, for a stream
        whose rule changes, where a fine-tuned network keeps the old rule. ``train.linear_candidate``: the
        learner's linear form, which learns more than a network from a few examples or a linear rule; while
        it is kept, the network from fresh weights, so that it returns once it does better."""
        if kind != "finetune":
            return []
        learner, train = self.learner, self.config.train
        if learner.is_linear:
            return [("scratch", learner.initial_architecture())]
        found = [("scratch", learner.arch)] if train.scratch_candidate and self.state.stages_done > 0 else []
        if train.linear_candidate and learner.linear_architecture is not None:
            found.append(("linear", learner.linear_architecture))
        return found

    def _best_of(
        self,
        tuned: FitReport,
        candidates: list[tuple[str, dict[str, Any]]],
        examples: StageExamples,
        fit_val: LabeledData,
        trainer: Trainer,
        stage: int,
    ) -> tuple[FitReport, str]:
        """The fine-tuned model against each of ``candidates`` trained on the same examples (``fit_val``: what
        early stopping reads); the one with the lower :meth:`_validation_loss` is kept, with its own decision.
        Every training, and every scoring on the validation set, counts in the stage's compute."""
        train, val = examples.train, examples.val
        best = (self._validation_loss(val), "finetune", self._snapshot(), tuned)
        flops, seconds = tuned.flops + self._prediction_flops(len(val)), tuned.seconds
        for kind, arch in candidates:
            self.learner.rebuild(arch, derive_seed(self.config.seed, kind, stage))
            report = self.learner.fit(train, fit_val, trainer)
            self.team.choose_decision(self.learner, examples)
            flops, seconds = flops + report.flops + self._prediction_flops(len(val)), seconds + report.seconds
            loss = self._validation_loss(val)
            if loss < best[0]:
                best = (loss, kind, self._snapshot(), report)
        _, kind, snapshot, report = best
        self._restore(snapshot)
        return replace(report, flops=flops, seconds=seconds), kind

    def _prediction_flops(self, examples: int) -> int:
        """FLOPs of the current model predicting ``examples`` examples."""
        return int(examples * self.learner.inference_flops_per_example()) if examples else 0

    def _snapshot(self) -> tuple[dict[str, Any], int, dict[str, torch.Tensor], TaskInfo]:
        learner = self.learner
        return dict(learner.arch), learner.build_seed, copy.deepcopy(learner.state_dict()), learner.task

    def _restore(self, snapshot: tuple[dict[str, Any], int, dict[str, torch.Tensor], TaskInfo]) -> None:
        arch, build_seed, state, task = snapshot
        if arch != self.learner.arch:
            self.learner.rebuild(arch, build_seed)
        self.learner.build_seed = build_seed
        self.learner.load_state_dict(state)
        self.learner.task = task

    def _validation_loss(self, val: LabeledData) -> float:
        """A classifier's class-weighted log-loss on ``val`` (a decision's cost or error on a few positives
        is too coarse to choose between two networks); a regression's measure."""
        task = self.learner.task
        if task.kind != "classification":
            loss = self.learner.task_measure.loss(self.learner.measure_on(val).value)
        else:
            loss = float(mean_with_error(*example_losses(self.learner, val)))
        # A model whose outputs went NaN must lose every comparison, not win them all by comparing false.
        return loss if math.isfinite(loss) else math.inf

    def train_stage(self, decision: Decision) -> StageRecord:
        """Grow (if told to and able), then train on the buffered data; checkpoint the result."""
        stage = self.state.stages_done + 1
        trainer = self._stage_trainer(stage)
        data = self.buffer.training_data(self.stage_plan, stage)
        examples = self.team.examples(data, self.learner, self.stage_plan.max_stage_examples)
        change_test_flops = self._prediction_flops(examples.scored)
        train, val = examples.train, examples.val
        kind = "scratch" if self.config.train.from_scratch else "finetune"
        growth: GrowthReport | None = None
        # Growth first: it chooses from the trained model (gMoE's losing expert, Firefly's candidates),
        # which a retraining from scratch then re-draws at the grown size.
        if decision.grows and self.learner.grows:
            growth = self._grow(val, trainer)
            if growth.grew:
                kind = "grow"
        if self.config.train.from_scratch and self.state.stages_done > 0:
            self.learner.reinitialize(derive_seed(self.config.seed, "scratch", stage))
        fit_val = val if self.team.stops_early(stage, examples, self.learner) else val.subset(slice(0, 0))
        candidates = self._candidates(kind)
        report: FitReport = self.learner.fit(train, fit_val, trainer)
        self.team.choose_decision(self.learner, examples)
        if candidates:
            report, kind = self._best_of(report, candidates, examples, fit_val, trainer, stage)
        # The passes that chose how to grow (validation losses, candidate scoring) and whether the stream
        # changed are training compute.
        report = replace(report, flops=report.flops + int(growth.flops or 0 if growth else 0) + change_test_flops)
        self.buffer.mark_trained(self.stage_plan, data.choice)
        self.team.trained(examples)
        val_measure = self.learner.measure_on(val).value
        self.state.stages_done = stage
        self.state.model_version += 1
        self.state.last_stage_chunks_seen = self.state.chunks_seen
        self.state.last_stage_at = self.clock()
        self.state.last_stage_flops_per_example = report.flops / max(1, len(train))
        self.state.last_stage_seconds_per_example = report.seconds / max(1, len(train))
        record = StageRecord(
            stage=stage,
            kind=kind,
            measure=self.learner.measure,
            val=val_measure,
            train_flops=report.flops,
            train_seconds=report.seconds,
            steps=report.steps,
            epochs=report.epochs,
            best_epoch=report.best_epoch,
            model_version=self.state.model_version,
            parameters=self.learner.num_parameters(),
            train_flops_per_example=report.flops / max(1, len(train)),
            growth=growth,
            chunks=list(data.trained),
            examples=len(train) + len(val),
            skipped=list(data.dropped) or None,
            threshold=self.learner.task.threshold,
            restarted=examples.restarted or None,
        )
        log.info("trained", extra={k: v for k, v in record.as_row().items() if k != "chunks"})
        bound = self.config.policy.max_model_age_seconds
        if bound is not None and report.seconds >= bound:
            log.warning(
                f"policy.max_model_age_seconds={bound:g} is below the {report.seconds:.0f} s stage {stage} took: "
                f"every chunk now forces a stage; raise the bound or cap a stage (train.max_stage_examples)"
            )
        for observer in self.observers:
            observer.on_stage(record, self)
        self._checkpoint(record, val)
        return record

    def say_unfilled_pool(self) -> None:
        """At a finite stream's end (a backtest): a pooled validation set the stream never filled is said."""
        self.team.say_unfilled_pool(self.state.chunks_seen)

    def _stage_trainer(self, stage: int) -> Trainer:
        """The trainer of stage ``stage``, with torch's global RNG seeded for the stage too."""
        seed = self.config.seed
        trainer = Trainer(
            self.config.train,
            self.optimizer_name,
            self.device,
            seed=derive_seed(seed, "stage", stage),
            augment=self.learner.task.augment,
            keep_epoch=self.config.train.epoch_kept(self.learner.task.is_team_task),
        )
        # Draws from torch's global RNG (a user's learner may make some) must also replay identically on resume.
        torch.manual_seed(derive_seed(seed, "torch", stage))
        return trainer

    def _grow(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        """The learner's growth step; returns its report (a step it skipped says why, and grew nothing)."""
        growth = self.learner.grow(val, trainer)
        self.learner.architecture_changed()
        return growth

    def _checkpoint(self, record: StageRecord, val: LabeledData) -> None:
        """Save the model the stage left as its version, and tell the observers where it is."""
        if self.checkpoints is None:
            return
        metrics = record.checkpoint_metrics()
        path = self.checkpoints.save(
            self.learner, record.model_version, metrics, validation=val, reservoirs=self.team.tensors()
        )
        for observer in self.observers:
            observer.on_checkpoint(record.model_version, str(path), metrics, self)

    def test_set_at(self, chunk_index: int) -> LabeledData | None:
        """The test set the model is measured on after chunk ``chunk_index``: drifted from ``stream.drift.at`` on."""
        if self.test_set is None or self.drift is None or not self.drift.applies_to(chunk_index):
            return self.test_set
        amount = self.drift.amount(chunk_index)
        if self._drifted_test_set is None or self._drifted_test_set[0] != amount:
            self._drifted_test_set = (amount, self.drift.test_set(self.test_set, chunk_index))
        return self._drifted_test_set[1]

    def test_measure(self, test_set: LabeledData | None) -> tuple[float, dict[str, float]] | None:
        """The model's measure on ``test_set`` and its other measures, taken again only when the model or
        the test set changed.

        Only a training stage changes the model, and each one bumps ``model_version``: with a waiting
        time w, w - 1 of every w chunks would otherwise measure the same model on the same examples.
        """
        if test_set is None:
            return None
        last = self._last_test
        if last is not None and last[0] == self.state.model_version and last[1] is test_set:
            return last[2]
        measurement, details = self.learner.assess(test_set)
        self._last_test = (self.state.model_version, test_set, (measurement.value, details))
        return measurement.value, details

    def record_step(
        self,
        chunk: Chunk,
        prequential: float,
        decision: Decision,
        stage: StageRecord | None,
        *,
        late: bool = False,
        details: dict[str, float] | None = None,
        baseline: float | None = None,
        reference: float | None = None,
        reliability: list[list[float]] | None = None,
    ) -> StepRecord:
        """The step's record, with the test-set measures and the running totals; ``details`` are the
        chunk's other measures, ``baseline`` the input-blind model's on the chunk (used without a test set),
        ``reference`` the reference learner's prequential measure (None: no reference), ``reliability``
        a binary task's reliability bins on the chunk (:meth:`_reliability`)."""
        measure = self.learner.measure
        test_set = self.test_set_at(chunk.index)
        tested = self.test_measure(test_set)
        test, test_details = tested if tested is not None else (None, None)
        # A measure with nothing to measure (recall on a test set without a positive) is None, as in
        # results.json, so that the daemon's series and the simulator's read alike.
        test = _finite_or_none(test)
        if test_set is not None and self.records_baseline:
            baseline = self.test_baseline(test_set)
        s = self.state
        params = self.learner.num_parameters()
        train_flops = stage.train_flops if stage else 0
        train_seconds = stage.train_seconds if stage else 0.0
        s.cumulative_prequential += prequential
        s.cumulative_train_flops += train_flops
        s.cumulative_parameters += params
        s.cumulative_train_seconds += train_seconds
        # The cumulative measure (the CER with the error rate) sums the test measure; a perplexity has none.
        cumulates = measure in CUMULATIVE_MEASURES and test is not None
        if cumulates and test is not None:
            s.cumulative_error += test
        window = self.config.stream.prequential_window
        s.recent_prequential = [*s.recent_prequential, prequential][-window:]
        if reference is not None:
            s.cumulative_reference += reference
            s.recent_reference = [*s.recent_reference, reference][-window:]
        age_chunks, age_seconds = self.model_age()
        record = StepRecord(
            t=s.chunks_seen,
            chunk=chunk.index,
            chunk_time=chunk.time,
            examples_seen=s.examples_seen,
            decision=decision.action,
            reason=decision.reason,
            measure=measure,
            test=test,
            prequential=prequential,
            cumulative_prequential=s.cumulative_prequential,
            cumulative=s.cumulative_error if cumulates else None,
            prequential_window=_finite_mean(s.recent_prequential),
            model_age_chunks=age_chunks,
            model_age_seconds=age_seconds,
            test_measures=_finite_values(test_details),
            prequential_measures=_finite_values(details),
            reliability=reliability,
            baseline=baseline,
            reference=reference,
            cumulative_reference=s.cumulative_reference if reference is not None else None,
            reference_window=_finite_mean(s.recent_reference) if reference is not None else None,
            train_flops=train_flops,
            cumulative_train_flops=s.cumulative_train_flops,
            parameters=params,
            cumulative_parameters=s.cumulative_parameters,
            inference_flops_per_example=self.learner.inference_flops_per_example(),
            train_seconds=train_seconds,
            cumulative_train_seconds=s.cumulative_train_seconds,
            model_version=s.model_version,
            wall_seconds=self.clock() - s.started_at,
            stage=stage,
            late=late,
        )
        s.series.append(record.as_row())
        for observer in self.observers:
            observer.on_step(record, self)
        return record

    def test_baseline(self, test_set: LabeledData) -> float:
        """The input-blind model's measure on ``test_set`` (taken once per test set)."""
        if self._test_baseline is None or self._test_baseline[0] is not test_set:
            self._test_baseline = (test_set, self.task_measure.baseline(test_set.y))
        return self._test_baseline[1]


def _finite_mean(values: list[float]) -> float | None:
    """The mean of the finite ``values`` (a diverged chunk's NaN says nothing of the others); None if none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _finite_values(measures: dict[str, float] | None) -> dict[str, float | None] | None:
    """The task's other measures with None for those undefined on this data; None when there are none."""
    return {name: _finite_or_none(value) for name, value in measures.items()} if measures else None
