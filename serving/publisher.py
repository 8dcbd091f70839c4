"""Publishing checkpoints to serving: the flow every backend shares.

:class:`Publisher` is the interface a serving backend implements (TorchServe, a local folder,
another server later). Its :meth:`~Publisher.publish` runs the flow of docs/serving.md for
one checkpoint version, holding the serving lock (:mod:`serving.live_pointer`) so that
``alma rollback`` in another process cannot interleave with the daemon:

1. re-serve the live version if the server lost it (a restarted TorchServe forgets its models);
2. guard: evaluate the candidate and the live version in process on the SAME validation sample
   (the candidate's ``validation.safetensors``) and refuse the candidate if its error exceeds the
   live one's by more than ``serving.promotion_margin``; the first version is always promoted;
3. stage: load the candidate on the server and probe it (backend);
4. make it the default (backend), then record it in the live pointer ``<model>/live.json``;
5. retire old versions (backend; best effort, the new version is already live).

Guarding before staging spares the server a registration that would be thrown away. Any failure
before step 4 leaves the live version serving. :class:`serving.background.BackgroundPublisher`
runs this flow on a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

import torch

from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.logs import error_text
from alma_daemon.observability import telemetry
from serving.codecs import codec_for
from serving.live_pointer import LivePointer, ServingState

log = logging.getLogger(__name__)

#: Validation examples a staged version is asked about before it may become the default.
PROBE_EXAMPLES = 8


class PublishError(RuntimeError):
    """A publishing step failed; the live version still serves. ``stage`` labels the failure metric.

    ``retry`` is False where trying again cannot help (the checkpoint itself is unusable).
    """

    def __init__(self, stage: str, message: str, retry: bool = True):
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.retry = retry


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

    def probe(self) -> tuple[dict, torch.Tensor]:
        """The request a staged version is probed with (the sample's first :data:`PROBE_EXAMPLES`,
        encoded as a client sends them) and the answers the checkpoint gives to it in process, decoded."""
        codec = codec_for(self.learner.task)
        request = codec.encode_request(self.sample.x[:PROBE_EXAMPLES])
        return request, codec.decode_response(codec.answer(self.learner, request))


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Publisher.publish` did with a version."""

    version: int
    #: "promoted", "refused" (by the guard) or "skipped" (a version at or below one already decided,
    #: or one no longer ``wanted``).
    action: str
    live_before: int | None
    #: The learner's measure ("error", or "perplexity" for language models).
    measure: str | None = None
    candidate_value: float | None = None
    live_value: float | None = None
    #: ``time.monotonic()`` when the version became the default (promoted versions only).
    promoted_at: float | None = None


class Publisher(ABC):
    """Makes checkpoint versions live on one serving backend, guarded, with rollback.

    Subclasses implement the backend steps; the order of the steps, the guard, and when the live pointer
    changes (under its lock, :mod:`serving.live_pointer`) are here.
    """

    #: Name in config (``serving.kind``).
    kind: str

    def __init__(self, store: CheckpointStore, promotion_margin: float):
        self.store = store
        self.promotion_margin = promotion_margin
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
                telemetry.PROMOTIONS_REFUSED.inc()
                log.warning("promotion refused", extra=asdict(outcome))
                self.pointer.write(ServingState(live=live, decided=version, previous=state.previous))
                return outcome
            self.stage(candidate)
            self._promote(version, ServingState(live=version, decided=version, previous=live))
            outcome = replace(outcome, promoted_at=time.monotonic())
            telemetry.SWAPS.inc()
            log.info("promoted", extra=asdict(outcome))
            self._retire_quietly(version)
            return outcome

    def rollback(self, version: int) -> int | None:
        """Make ``version`` the default again, without the guard; returns the version it replaced."""
        if version not in self.store.versions():
            raise ValueError(f"version {version} is not in {self.store.folder} (have {self.store.versions()})")
        with self.pointer.locked():
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
        """Promote unless the candidate is worse than ``live`` by more than the margin on its sample."""
        measure = candidate.learner.measure
        with failing_as("guard"):
            value = candidate.learner.evaluate(candidate.sample)[measure]
            if live is None:
                return Outcome(candidate.version, "promoted", None, measure, value)
            live_value = self.store.load(live).evaluate(candidate.sample)[measure]
        # A candidate that answers NaN never passes; a live version that does is always replaced.
        promoted = math.isfinite(value) and not value > live_value + self.promotion_margin
        return Outcome(candidate.version, "promoted" if promoted else "refused", live, measure, value, live_value)

    def _promote(self, version: int, state: ServingState) -> None:
        self.make_default(version)
        with failing_as("set_default"):
            self.pointer.write(state)
        telemetry.LIVE_VERSION.set(version)

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

    def _retire_quietly(self, live: int) -> None:
        try:
            self.retire(live)
        except PublishError as err:
            # The new version already serves; the next publish retires what is left.
            telemetry.SWAP_FAILURES.labels(err.stage).inc()
            log.warning("retiring old versions failed", extra={"error": str(err)})
