"""Publishing checkpoints to serving: the flow every backend shares.

:class:`Publisher` is the interface a serving backend implements (TorchServe, a local folder,
another server later). Its :meth:`~Publisher.publish` runs the flow of docs/serving.md for
one checkpoint version, holding the serving lock (:mod:`serving.publishing.live_pointer`) so that
``alma rollback`` in another process cannot interleave with the daemon:

1. re-serve the live version if the server lost it (a restarted TorchServe forgets its models);
2. guard: evaluate the candidate and the live version in process on the SAME validation examples
   (the candidate's ``validation.safetensors``, topped up from earlier versions' samples to
   ``serving.promotion_min_examples``, and for a binary task to ``serving.promotion_min_positives``
   positives) and refuse the candidate only if its loss on the task's measure is larger by more than
   ``serving.promotion_margin`` and a paired test finds the difference beyond the sample's noise, or
   it finds fewer of a binary task's positives beyond that noise (:mod:`serving.publishing.guard`); the first
   version is always promoted;
3. stage: load the candidate on the server and probe it (backend);
4. make it the default (backend), then record it in the live pointer ``<model>/live.json``;
5. retire old versions (backend; best effort, the new version is already live);
6. after a promotion or a refusal, delete the versions on disk beyond ``daemon.keep_checkpoints``
   (:mod:`serving.publishing.retention`; best effort too).

Guarding before staging spares the server a registration that would be thrown away. Any failure
before step 4 leaves the live version serving. :class:`serving.publishing.background.BackgroundPublisher`
runs this flow on a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from alma_daemon import metrics
from alma_daemon.config import ServingConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.logs import ExplainedError, error_text
from serving.protocols.codecs import codec_for
from serving.publishing.guard import PromotionGuard, Verdict
from serving.publishing.live_pointer import LivePointer, ServingState
from serving.publishing.retention import prune

log = logging.getLogger(__name__)

#: Validation examples a staged version is asked about before it may become the default.
PROBE_EXAMPLES = 8
#: The guard sample grows for positives to at most this many times ``serving.promotion_min_examples``
#: examples (6,000 by default: 30 positives at a share of 0.5 %), so that a stream with hardly any
#: positive does not read every saved sample at every publish.
POSITIVES_TOP_UP_FACTOR = 20


class PublishError(RuntimeError):
    """A publishing step failed; the live version still serves. ``stage`` labels the failure metric.

    ``retry`` is False where trying again cannot help (the checkpoint itself is unusable).
    """

    def __init__(self, stage: str, message: str, retry: bool = True):
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.retry = retry


class VersionDeleted(ExplainedError):
    """A rollback to a version deleted past ``daemon.keep_checkpoints`` (:mod:`serving.publishing.retention`)."""


@contextlib.contextmanager
def failing_as(stage: str) -> Iterator[None]:
    """Re-raise any error of the block as a :class:`PublishError` of ``stage``."""
    try:
        yield
    except PublishError:
        raise
    except Exception as err:
        raise PublishError(stage, error_text(err)) from err


@dataclass(frozen=True)
class Candidate:
    """A checkpoint version loaded in process, with the validation sample saved alongside it."""

    version: int
    learner: Learner
    sample: LabeledData

    def probe(self) -> tuple[dict[str, Any], torch.Tensor]:
        """The request a staged version is probed with (the sample's first :data:`PROBE_EXAMPLES`,
        encoded as a client sends them) and the answers the checkpoint gives to it in process, decoded."""
        codec = codec_for(self.learner.task)
        request = codec.encode_json(self.sample.x[:PROBE_EXAMPLES])
        return request, codec.decode_json(codec.answer_json(self.learner, request))


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Publisher.publish` did with a version."""

    version: int
    #: "promoted", "refused" (by the guard) or "skipped" (a version at or below one already decided,
    #: or one no longer ``wanted``).
    action: str
    live_before: int | None
    #: The task's measure (``task.measure``: "error", "recall", "mse", "perplexity", ...), the unit of
    #: the two values.
    measure: str | None = None
    candidate_value: float | None = None
    live_value: float | None = None
    #: ``time.monotonic()`` when the version became the default (promoted versions only).
    promoted_at: float | None = None
    #: The guard's sample size (with the examples topped up from earlier versions; language models:
    #: the candidate's own sequences).
    examples: int | None = None
    #: Against a live version, on the task's measure (:class:`serving.publishing.guard.Verdict`): examples whose loss
    #: is larger in the candidate's answers, and smaller (None for a bootstrapped measure), and the
    #: paired test's p-value.
    worse_on: int | None = None
    better_on: int | None = None
    p_value: float | None = None
    #: Binary tasks: the positives in the guard sample.
    positives: int | None = None
    #: The guard's one line: the measure's values, its tests, and why the version is refused or promoted.
    reason: str | None = None


def guard_settings(serving: ServingConfig) -> dict[str, Any]:
    """The guard's keyword arguments of :class:`Publisher` as the ``serving`` section sets them (its
    margin is the one positional argument)."""
    return {
        "promotion_alpha": serving.promotion_alpha,
        "promotion_min_examples": serving.promotion_min_examples,
        "promotion_min_positives": serving.promotion_min_positives,
        "guard_positive_recall": serving.guard_positive_recall,
    }


class Publisher(ABC):
    """Makes checkpoint versions live on one serving backend, guarded, with rollback.

    Subclasses implement the backend steps; the order of the steps, the guard, and when the live pointer
    changes (under its lock, :mod:`serving.publishing.live_pointer`) are here.
    """

    #: Name in config (``serving.kind``).
    kind: str

    def __init__(
        self,
        store: CheckpointStore,
        promotion_margin: float,
        *,
        promotion_alpha: float = PromotionGuard.alpha,
        promotion_min_examples: int = PromotionGuard.min_examples,
        promotion_min_positives: int = PromotionGuard.min_positives,
        guard_positive_recall: bool = PromotionGuard.positive_recall,
        keep_checkpoints: int | None = None,
    ):
        self.store = store
        #: ``daemon.keep_checkpoints``: versions on disk beyond it are deleted after each decision
        #: (None: none are).
        self.keep_checkpoints = keep_checkpoints
        self.promotion = PromotionGuard(
            promotion_margin, promotion_alpha, promotion_min_examples, promotion_min_positives, guard_positive_recall
        )
        self.pointer = LivePointer(store.folder)
        #: The missing live version last warned about, so that a resync every 30 s warns once.
        self._missing_live: int | None = None

    # -- backend steps ----------------------------------------------------------------------------
    @abstractmethod
    def ensure_serving(self, live: int) -> None:
        """Make sure the server answers with ``live`` by default (after a server restart, say)."""

    @abstractmethod
    def stage(self, candidate: Candidate) -> None:
        """Load the candidate on the server and check its answers; raise :class:`PublishError` if not."""

    @abstractmethod
    def make_default(self, version: int) -> None:
        """Route the model's default traffic to ``version``."""

    @abstractmethod
    def retire(self, live: int) -> None:
        """Release versions the server no longer needs, never ``live``."""

    def served_versions(self) -> list[int] | None:
        """Versions loaded on the server (None where the backend has no such notion)."""
        return None

    # -- the flow ---------------------------------------------------------------------------------
    def live_version(self) -> int | None:
        return self.pointer.read().live

    def publish(self, version: int, wanted: Callable[[], bool] | None = None) -> Outcome:
        """Guard, stage and promote ``version``; see the module docstring for the steps.

        ``wanted``, asked under the serving lock, says whether ``version`` is still to be published
        (the background worker forgets its hand-offs before a reload).
        """
        with self.pointer.locked():
            state = self.pointer.read()
            live = self._serve_live(state)
            if version <= state.decided:
                return Outcome(version, "skipped", live)
            if wanted is not None and not wanted():
                log.info("version withdrawn before it was published", extra={"version": version})
                return Outcome(version, "skipped", live)
            candidate = self.load_candidate(version)
            outcome = self.guard(candidate, live)
            if outcome.action == "refused":
                metrics.PROMOTIONS_REFUSED.inc()
                log.warning(refusal_message(outcome, self.promotion), extra=_fields(outcome, "reason"))
                self.pointer.write(ServingState(live=live, decided=version, previous=state.previous))
                self._prune_quietly()
                return outcome
            self.stage(candidate)
            self._promote(version, ServingState(live=version, decided=version, previous=live))
            outcome = replace(outcome, promoted_at=time.monotonic())
            metrics.SWAPS.inc()
            log.info("promoted", extra=_fields(outcome))
            self._retire_quietly(version)
            self._prune_quietly()
            return outcome

    def rollback(self, version: int) -> int | None:
        """Make ``version`` the default again, without the guard; returns the version it replaced."""
        with self.pointer.locked():
            self._check_stored(version)
            state = self.pointer.read()
            try:
                live = self._serve_live(state)
            except PublishError as err:
                # A rollback is the way out of a live version the server can no longer load: re-serving
                # it only readies the server to replace a stale default, so a failure there stops
                # nothing but a rollback to that very version.
                if version == state.live:
                    raise
                log.warning(
                    "the live version could not be served again; rolling back anyway", extra={"error": str(err)}
                )
                live = state.live
            if version != live:
                # Staging reuses a registration that serves this checkpoint (the backend checks).
                self.stage(self.load_candidate(version))
                self._promote(version, ServingState(live=version, decided=state.decided, previous=state.live))
                log.info("rolled back", extra={"version": version, "replaced": state.live})
            self._retire_quietly(version)
            return state.live

    def _check_stored(self, version: int) -> None:
        """Raise the one line that says why ``version`` cannot be served, where it is not on disk."""
        versions = self.store.versions()
        if version in versions:
            return
        if versions and 0 < version < versions[-1]:
            keep = f" ({self.keep_checkpoints})" if self.keep_checkpoints is not None else ""
            raise VersionDeleted(
                f"version {version} was deleted from {self.store.folder}: the model store keeps the newest "
                f"daemon.keep_checkpoints{keep} versions and the live one; `alma versions` lists those left "
                f"({versions[0]} to {versions[-1]})"
            )
        raise ValueError(f"version {version} is not in {self.store.folder} (have {versions})")

    def resync(self) -> None:
        """Re-serve the live version if the server lost it; the background worker calls this when idle."""
        with self.pointer.locked():
            self._serve_live(self.pointer.read())

    def load_candidate(self, version: int) -> Candidate:
        with failing_as("guard"):
            sample = self.store.validation(version)
            if sample is None or len(sample) == 0:
                raise PublishError(
                    "guard", f"version {version} has no validation sample to guard and probe it with", retry=False
                )
            return Candidate(version, self.store.load(version), sample)

    def guard(self, candidate: Candidate, live: int | None) -> Outcome:
        """Promote unless the candidate is worse than ``live`` on the task's measure beyond the margin and
        the sample's noise, or finds fewer of a binary task's positives beyond that noise."""
        measure = candidate.learner.task_measure
        with failing_as("guard"):
            if live is None:
                value = candidate.learner.evaluate(candidate.sample)[measure.name]
                return Outcome(candidate.version, "promoted", None, measure.name, value, examples=len(candidate.sample))
            if measure.target.kind == "language_model":
                return self._guard_by_margin(candidate, live)
            sample = self.guard_sample(candidate)
            verdict = self.promotion.judge(
                measure,
                candidate.learner.outputs(sample),
                self.store.load(live).outputs(sample),
                sample.y,
                len(candidate.sample),
            )
        return _outcome(candidate.version, live, verdict)

    def _guard_by_margin(self, candidate: Candidate, live: int) -> Outcome:
        """Language models: perplexity on the candidate's sample (every token of 512 sequences) against
        the live version's plus the margin, no test. A candidate that answers NaN never passes; a live
        version that does is always replaced."""
        measure = candidate.learner.measure
        value = candidate.learner.evaluate(candidate.sample)[measure]
        live_value = self.store.load(live).evaluate(candidate.sample)[measure]
        promoted = math.isfinite(value) and not value > live_value + self.promotion.margin
        action = "promoted" if promoted else "refused"
        return Outcome(candidate.version, action, live, measure, value, live_value, examples=len(candidate.sample))

    def guard_sample(self, candidate: Candidate) -> LabeledData:
        """The examples the guard asks both versions about: the candidate's validation sample, then,
        while they number fewer than ``serving.promotion_min_examples`` or, for a binary task, hold
        fewer than ``serving.promotion_min_positives`` positives, the samples saved with the versions
        before it, newest first, each example once (with ``stream.replay`` the samples overlap). The
        sample grows by whole examples, positive or not, so that it keeps the stream's class mix for
        the task's measure, and for positives to at most :data:`POSITIVES_TOP_UP_FACTOR` times
        ``promotion_min_examples`` examples. Versions after the candidate are never read, so the decision does not
        depend on how far training ran ahead of publishing."""
        own = candidate.sample
        task = candidate.learner.task
        wanted = self.promotion.min_examples
        wanted_positives = self.promotion.min_positives if task.target_kind == "binary" else 0

        def enough(examples: int, positives: int) -> bool:
            if examples >= wanted * POSITIVES_TOP_UP_FACTOR:
                return True
            return examples >= wanted and positives >= wanted_positives

        held, positives = len(own), int((own.y == task.positive).sum()) if wanted_positives else 0
        if enough(held, positives):
            return own
        parts = [own]
        seen = {_example_key(own, i) for i in range(len(own))}
        for version in reversed([v for v in self.store.versions() if v < candidate.version]):
            sample = self.store.validation(version)
            if sample is None or sample.x.shape[1:] != own.x.shape[1:] or sample.x.dtype != own.x.dtype:
                continue
            new: list[int] = []
            for i in range(len(sample)):
                if enough(held, positives):
                    break
                key = _example_key(sample, i)
                if key not in seen:
                    seen.add(key)
                    new.append(i)
                    held += 1
                    positives += bool(wanted_positives and int(sample.y[i]) == task.positive)
            if new:
                parts.append(sample.subset(torch.tensor(new)))
            if enough(held, positives):
                break
        return LabeledData.concat(parts)

    def _promote(self, version: int, state: ServingState) -> None:
        self.make_default(version)
        with failing_as("set_default"):
            self.pointer.write(state)
        metrics.LIVE_VERSION.set(version)

    def _serve_live(self, state: ServingState) -> int | None:
        """Make the server answer with the live version by default again where it does not (a
        restarted TorchServe forgets its models; after a withdrawal it may still answer with the
        withdrawn version); the live version, None where none is usable. Every flow starts here, a
        publish of a version already decided included: the reload hands the committed version over
        again for this."""
        live = self._usable_live(state.live)
        if live is not None:
            with failing_as("register"):
                self.ensure_serving(live)
        return live

    def _usable_live(self, live: int | None) -> int | None:
        if live is not None and live not in self.store.versions():
            if live != self._missing_live:
                log.warning(
                    "live version missing from the model store; the next version is promoted unguarded",
                    extra={"version": live, "store": str(self.store.folder)},
                )
                self._missing_live = live
            return None
        return live

    def _prune_quietly(self) -> None:
        if self.keep_checkpoints is None:
            return
        state = self.pointer.read()
        try:
            prune(self.store, self.keep_checkpoints, state, ruled_up_to=state.decided)
        except OSError as err:
            # Deleting frees the disk only; the next decision deletes what is left.
            log.warning("deleting old model versions failed", extra={"error": str(err)})

    def _retire_quietly(self, live: int) -> None:
        try:
            self.retire(live)
        except PublishError as err:
            # The new version already serves; the next publish retires what is left.
            metrics.SWAP_FAILURES.labels(err.stage).inc()
            log.warning("retiring old versions failed", extra={"error": str(err)})


def _outcome(version: int, live: int, verdict: Verdict) -> Outcome:
    headline = verdict.headline
    return Outcome(
        version,
        "promoted" if verdict.promoted else "refused",
        live,
        headline.measure,
        headline.candidate_value,
        headline.live_value,
        examples=verdict.examples,
        worse_on=headline.test.worse_on,
        better_on=headline.test.better_on,
        p_value=headline.test.p_value,
        positives=verdict.positives,
        reason=verdict.reason,
    )


def refusal_message(outcome: Outcome, promotion: PromotionGuard) -> str:
    """The one line that says why ``outcome``'s version is not published (its numbers follow as fields,
    the reason's too)."""
    head = f"version {outcome.version} not promoted, version {outcome.live_before} stays live"
    if outcome.reason is None:
        return (
            f"{head}: its {outcome.measure} on {outcome.examples} validation sequences exceeds the live one's by "
            f"more than promotion_margin {promotion.margin:g}"
        )
    return f"{head}: {outcome.reason}"


def _fields(outcome: Outcome, *said: str) -> dict[str, Any]:
    """The outcome's fields for a log line: not the empty ones, the action or those the message ``said``
    already, or the monotonic clock reading."""
    left_out = ("action", "promoted_at", *said)
    return {k: v for k, v in asdict(outcome).items() if v is not None and k not in left_out}


def _example_key(data: LabeledData, i: int) -> bytes:
    """A digest of example ``i`` (input and label), to take an example once into the guard sample."""
    digest = hashlib.blake2b(data.x[i].contiguous().numpy().tobytes(), digest_size=16)
    digest.update(data.y[i].contiguous().numpy().tobytes())
    return digest.digest()
