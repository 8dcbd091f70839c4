"""Publishing checkpoints to serving: the flow every backend shares, and the background worker.

:class:`Publisher` is the interface a serving backend implements (TorchServe, a local folder,
another server later). Its :meth:`~Publisher.publish` runs the flow of docs/serving.md for
one checkpoint version, holding a file lock so that ``alma rollback`` in another process cannot
interleave with the daemon:

1. re-serve the live version if the server lost it (a restarted TorchServe forgets its models);
2. guard: evaluate the candidate and the live version in process on the SAME validation sample
   (the candidate's ``validation.safetensors``) and refuse the candidate if its error exceeds the
   live one's by more than ``serving.promotion_margin``; the first version is always promoted;
3. stage: load the candidate on the server and probe it (backend);
4. make it the default (backend), then record it in the live pointer ``<model>/live.json``;
5. retire old versions (backend; best effort, the new version is already live).

A version whose step never committed is deleted by the restarted daemon and written again under
the same number; :func:`withdraw` removes it from serving and deletes it, so the redone version is
published like a new one.

Guarding before staging spares the server a registration that would be thrown away. Any failure
before step 4 leaves the live version serving. :class:`BackgroundPublisher` runs publishing on a
worker thread, so training never waits for serving, and retries failures with backoff.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.logs import error_text
from alma_daemon.observability import telemetry
from alma_daemon.runtime import run_beside_training
from serving.archiver import ARCHIVES, remove_archives

log = logging.getLogger(__name__)

LIVE_POINTER = "live.json"
LOCK_FILE = ".serving.lock"
#: How long ``rollback`` or ``publish`` waits for another process's publishing to finish.
LOCK_TIMEOUT_SECONDS = 300.0
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


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Publisher.publish` did with a version."""

    version: int
    #: "promoted", "refused" (by the guard) or "skipped" (a version at or below one already decided,
    #: or one whose hand-off was withdrawn before it was published).
    action: str
    live_before: int | None
    #: The learner's measure ("error", or "perplexity" for language models).
    measure: str | None = None
    candidate_value: float | None = None
    live_value: float | None = None
    #: ``time.monotonic()`` when the version became the default (promoted versions only).
    promoted_at: float | None = None


@dataclass
class ServingState:
    """The live pointer's content: what serves, and the newest version the guard has ruled on."""

    live: int | None = None
    #: Versions up to this one were promoted or refused; catching up after a restart starts above it.
    decided: int = 0
    updated_at: float = 0.0
    #: The version live before ``live``, which serves again if ``live`` is withdrawn (:func:`withdraw`).
    previous: int | None = None


class LivePointer:
    """``<model_store>/<model>/live.json``, replaced atomically, and the lock around changing it."""

    def __init__(self, folder: Path):
        self.path = folder / LIVE_POINTER
        self.lock_path = folder / LOCK_FILE

    def read(self) -> ServingState:
        if not self.path.is_file():
            return ServingState()
        data = json.loads(self.path.read_text())
        return ServingState(
            live=data.get("live"),
            decided=int(data.get("decided", 0)),
            updated_at=float(data.get("updated_at", 0.0)),
            previous=data.get("previous"),
        )

    def write(self, state: ServingState) -> None:
        state.updated_at = time.time()
        write_json_atomic(self.path, asdict(state), indent=2)

    @contextlib.contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
        """Hold an exclusive lock shared with other processes (the daemon, ``alma rollback``)."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as handle:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another process has held {self.lock_path} for {timeout:.0f} s") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


class Publisher(ABC):
    """Makes checkpoint versions live on one serving backend, guarded, with rollback.

    Subclasses implement the backend steps; the order, the guard, the pointer and the lock are here.
    """

    #: Name in config (``serving.kind``).
    kind: str

    def __init__(self, store: CheckpointStore, promotion_margin: float):
        self.store = store
        self.promotion_margin = promotion_margin
        self.pointer = LivePointer(store.folder)

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

        ``wanted``, asked under the serving lock, says whether ``version`` is still to be published:
        the background worker's hand-off of it may have been withdrawn meanwhile (a reload deletes
        the checkpoint of an interrupted step, and the redone step writes the number again).
        """
        with self.pointer.locked():
            state = self.pointer.read()
            live = self._usable_live(state.live)
            # Even for a version already decided: after a withdrawal the server may still answer with
            # the withdrawn version, and the reload hands over the committed one to set that right.
            if live is not None:
                with failing_as("register"):
                    self.ensure_serving(live)
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
            if version == state.live:
                with failing_as("register"):
                    self.ensure_serving(version)
            else:
                if version not in (self.served_versions() or ()):
                    self.stage(self.load_candidate(version))
                self._promote(version, ServingState(live=version, decided=state.decided, previous=state.live))
                log.info("rolled back", extra={"version": version, "replaced": state.live})
            self._retire_quietly(version)
            return state.live

    def resync(self) -> None:
        """Re-serve the live version if the server lost it; the background worker calls this when idle."""
        with self.pointer.locked():
            live = self._usable_live(self.pointer.read().live)
            if live is not None:
                with failing_as("register"):
                    self.ensure_serving(live)

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

    def _usable_live(self, live: int | None) -> int | None:
        if live is not None and live not in self.store.versions():
            log.warning(
                "live version missing from the model store; the next version is promoted unguarded",
                extra={"version": live, "store": str(self.store.folder)},
            )
            return None
        return live

    def _retire_quietly(self, live: int) -> None:
        try:
            self.retire(live)
        except PublishError as err:
            # The new version already serves; the next publish retires what is left.
            telemetry.SWAP_FAILURES.labels(err.stage).inc()
            log.warning("retiring old versions failed", extra={"error": str(err)})


def withdraw(store: CheckpointStore, version: int) -> None:
    """Remove ``version`` from serving and delete its checkpoint, whose step never committed.

    The restarted daemon redoes the step and writes the version again under the same number, with
    weights that may differ (training on a GPU is not bit for bit repeatable). So the live pointer
    forgets the deleted one: where it was live, the version live before it is live again (the
    newest version below it on disk, where the pointer does not say, as one written before it had
    ``previous`` or a rollback from no live version), and the guard's ``decided`` drops below it,
    so that the redone version is guarded and published as a new one, not skipped. Its archives
    and its folder are deleted.

    All of it happens under the serving lock, which the caller (the daemon's main thread) waits for
    while a publish holds it, at most :data:`LOCK_TIMEOUT_SECONDS` (then ``TimeoutError``, and the
    next start withdraws it again): a publish that takes the lock afterwards finds neither the
    version in the pointer nor its checkpoint. A server may still answer with the deleted version
    until the background worker makes the live version its default again (``ensure_serving``), at
    once: a starting worker resyncs first, and a reload hands the committed version over again,
    whose publish calls ``ensure_serving`` before it skips the decided version. TorchServe's
    registration of it is replaced when the redone version is staged, as its archive's name differs
    (:mod:`serving.archiver`).
    """
    pointer = LivePointer(store.folder)
    with pointer.locked():
        state = pointer.read()
        withdrawn = replace(state, decided=min(state.decided, version - 1))
        if state.live == version:
            below = [v for v in store.versions() if v < version]
            fallback = state.previous if state.previous is not None else (below[-1] if below else None)
            withdrawn.live, withdrawn.previous = fallback, None
        elif state.previous == version:
            withdrawn.previous = None
        if pointer.path.is_file() and withdrawn != state:
            pointer.write(withdrawn)
            log.warning(
                "withdrew a version from serving",
                extra={"version": version, "live": withdrawn.live, "decided": withdrawn.decided},
            )
        remove_archives(store.folder / ARCHIVES, store.model_name, version)
        if store.path(version).exists():
            shutil.rmtree(store.path(version))


class BackgroundPublisher:
    """Publishes each new checkpoint on a worker thread; failures are retried with backoff.

    Only the newest pending version is published: a checkpoint written while an older one is
    still being published (or retried) supersedes it. When idle, the worker re-serves the live
    version every ``resync_seconds`` in case the server restarted and forgot it.

    Each hand-off belongs to a generation, which :meth:`forget_pending` ends: a version handed over
    before is then neither published (the check runs under the serving lock) nor retried.
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        retry_initial_seconds: float = 1.0,
        retry_max_seconds: float = 60.0,
        resync_seconds: float = 30.0,
    ):
        self.publisher = publisher
        self.retry_initial_seconds = retry_initial_seconds
        self.retry_max_seconds = retry_max_seconds
        self.resync_seconds = resync_seconds
        self._condition = threading.Condition()
        self._pending: int | None = None
        self._generation = 0
        self._written_at: dict[int, float] = {}
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: The latest outcome and error, for status pages and tests.
        self.last_outcome: Outcome | None = None
        self.last_error: PublishError | None = None

    def submit(self, version: int, written_at: float | None = None) -> None:
        """Queue ``version`` for publishing (returns at once).

        ``written_at`` (``time.monotonic()`` when the checkpoint was written) starts the swap
        duration that ``alma_swap_duration_seconds`` observes once the version is live.
        """
        with self._condition:
            if written_at is not None:
                self._written_at[version] = written_at
            if self._pending is None or version > self._pending:
                self._pending = version
            self._condition.notify_all()

    def forget_pending(self) -> None:
        """Forget every version handed over so far, one being published or retried included: the
        engine is about to be reloaded, which deletes the checkpoint of the interrupted step (maybe
        handed over already, if Redis lost its commit), and the redone step writes it again before
        its commit. The reload hands the committed version over again."""
        with self._condition:
            self._generation += 1
            self._pending = None
            self._condition.notify_all()

    def start(self) -> BackgroundPublisher:
        """Start the worker; queues the newest checkpoint if it is newer than any decided version."""
        if self._thread is not None:
            return self
        state = self.publisher.pointer.read()
        if state.live is not None:
            telemetry.LIVE_VERSION.set(state.live)
        latest = self.publisher.store.latest()
        if latest is not None and latest > state.decided:
            self.submit(latest)
        self._thread = threading.Thread(target=self._run, name="alma-publisher", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker after its current step; a pending version stays for the next start."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is pending or being published; False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._pending is not None or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._condition.wait(remaining)
            return True

    def not_live(self) -> tuple[int, int | None] | None:
        """The newest checkpoint version and the live one, when they differ; None when it is live."""
        latest, live = self.publisher.store.latest(), self.publisher.pointer.read().live
        return None if latest == live else (latest or 0, live)

    def _run(self) -> None:
        run_beside_training()
        delay = self.retry_initial_seconds
        # A resync first: a start may follow a withdrawal that left the server answering with the
        # withdrawn version (docs/serving.md), and nothing else may be pending to set that right.
        next_resync = time.monotonic()
        while True:
            with self._condition:
                while self._pending is None and not self._stopping:
                    if not self._condition.wait(max(0.0, next_resync - time.monotonic())):
                        break
                if self._stopping:
                    return
                version, self._pending, self._busy = self._pending, None, True
                generation = self._generation
            try:
                if version is None:
                    self.publisher.resync()
                else:
                    self._publish(version, generation)
                delay = self.retry_initial_seconds
                wait = 0.0
            except Exception as err:
                # Errors outside the steps (the lock, the pointer, the model store) come before any
                # server call, like the guard's.
                error = err if isinstance(err, PublishError) else PublishError("guard", repr(err))
                self.last_error = error
                telemetry.SWAP_FAILURES.labels(error.stage).inc()
                log.warning(
                    "publishing failed",
                    extra={"version": version, "error": str(error), "retry_in_seconds": delay if error.retry else None},
                )
                if version is not None and error.retry:
                    self._requeue(version, generation)
                wait, delay = delay, min(delay * 2, self.retry_max_seconds)
            next_resync = time.monotonic() + self.resync_seconds
            with self._condition:
                self._busy = False
                self._condition.notify_all()
                if wait:
                    self._condition.wait_for(lambda: self._stopping, wait)

    def _publish(self, version: int, generation: int) -> None:
        outcome = self.publisher.publish(version, wanted=lambda: self._current(generation))
        # A publish that ends (refused or skipped included) settles the failures before it; a resync
        # that passes does not, as it publishes nothing.
        self.last_outcome, self.last_error = outcome, None
        with self._condition:
            written_at = self._written_at.get(version)
            self._written_at = {v: t for v, t in self._written_at.items() if v > version}
        if outcome.promoted_at is not None and written_at is not None:
            telemetry.SWAP_DURATION.observe(outcome.promoted_at - written_at)

    def _current(self, generation: int) -> bool:
        with self._condition:
            return generation == self._generation

    def _requeue(self, version: int, generation: int) -> None:
        with self._condition:
            if generation == self._generation and (self._pending is None or version > self._pending):
                self._pending = version
