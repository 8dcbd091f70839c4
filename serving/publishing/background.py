"""The background worker that runs publishing beside training, so training never waits for serving.

The daemon submits each version once its step is committed (``PublishHandoff``); the worker
publishes the newest one, retries failures with backoff and, when idle, re-serves the live version
in case the server restarted.
"""

from __future__ import annotations

import logging
import threading
import time

from alma_daemon import metrics
from alma_daemon.runtime import run_beside_training
from serving.publishing.publisher import Outcome, Publisher, PublishError

log = logging.getLogger(__name__)


class BackgroundPublisher:
    """Publishes each submitted version on a worker thread; failures are retried with backoff.

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
        #: The latest outcome, and the error of the latest failure, cleared when a publish ends.
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
        """Forget every version handed over so far, one being published or retried included (the
        engine is about to be reloaded; see :func:`serving.publishing.live_pointer.withdraw`)."""
        with self._condition:
            self._generation += 1
            self._pending = None
            self._condition.notify_all()

    def start(self) -> BackgroundPublisher:
        """Start the worker; queues the newest checkpoint if it is newer than any decided version, and
        removes what a deletion cut short by a crash left in the model store (no deletion runs beside
        this: the start-up's withdrawal is done, and the worker, which prunes, is not running yet)."""
        if self._thread is not None:
            return self
        try:
            self.publisher.store.sweep_trash()
        except OSError as err:
            log.warning("removing deleted model versions failed", extra={"error": str(err)})
        state = self.publisher.pointer.read()
        if state.live is not None:
            metrics.LIVE_VERSION.set(state.live)
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
        # A resync first: after a withdrawal the server may still answer with the withdrawn version,
        # and nothing else may be pending to set that right.
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
                metrics.SWAP_FAILURES.labels(error.stage).inc()
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
            metrics.SWAP_DURATION.observe(outcome.promoted_at - written_at)

    def _current(self, generation: int) -> bool:
        with self._condition:
            return generation == self._generation

    def _requeue(self, version: int, generation: int) -> None:
        with self._condition:
            if generation == self._generation and (self._pending is None or version > self._pending):
                self._pending = version
