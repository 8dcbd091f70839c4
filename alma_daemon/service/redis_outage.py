"""Riding out a Redis outage in process (docs/service.md, "Outages").

While Redis cannot be reached the daemon keeps its process, reports itself degraded and retries
with backoff; when Redis answers again it checks that Redis still holds the stream
(``stream_identity.py``) and resumes from the last committed step, exactly as after a crash. An
outage longer than ``daemon.outage_limit_seconds`` ends the run with
:class:`~alma_daemon.infra.outages.OutageTooLong`.

At start-up (:class:`StartupWait`), before the main loop and the threads run, each step that meets
an outage (the first connection, the restore, the ingest's first reads) waits for Redis the same
way and is then redone whole. Torch-free: ``alma run``'s Redis component imports this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from alma_daemon.infra.outages import (
    REDIS_UNREACHABLE,
    Outage,
    OutageBoard,
    OutageTooLong,
    one_line,
    retry_delays,
    wait_out,
)
from alma_daemon.infra.unreachable import outage_line

if TYPE_CHECKING:
    # Named only for types: this module is torch-free (see above), and these import torch.
    from alma_daemon.core.engine import Engine
    from alma_daemon.service.stream_identity import StreamIdentity

log = logging.getLogger(__name__)

T = TypeVar("T")


class RedisOutage:
    """Waits out Redis and reloads the committed state through ``reload_committed`` once it is back."""

    def __init__(
        self,
        outages: OutageBoard,
        stop_requested: threading.Event,
        reload_committed: Callable[[], Engine],
        report_health: Callable[[], None],
        redis_name: str,
        limit_seconds: float,
    ):
        self.outages = outages
        self.stop_requested = stop_requested
        self.reload_committed = reload_committed
        self.report_health = report_health
        self.redis_name = redis_name
        self.limit_seconds = limit_seconds

    def wait_for_redis(self, error: BaseException, identity: StreamIdentity) -> None:
        """Stay degraded until Redis answers again (or a stop is asked for), then reload."""
        outage = self.outages.down("redis", error)
        log.warning(
            outage_line("redis", self.redis_name, error, self.limit_seconds),
            extra={"redis": self.redis_name, "error": outage.reason, "limit_seconds": self.limit_seconds},
        )
        self.report_health()
        delays, failures = retry_delays(), 0
        while True:
            self.outages.check_limit()
            if self.stop_requested.wait(delays.compute(failures)):
                return
            failures += 1
            try:
                identity.restarted()
                engine = self.reload_committed()
            except REDIS_UNREACHABLE as again:
                self.outages.down("redis", again)
                continue
            break
        ended = self.outages.up("redis")
        log.warning(
            "Redis is back: resumed from the last committed step",
            extra={
                "outage_seconds": round(time.time() - ended.since, 1) if ended else None,
                "chunks_seen": engine.state.chunks_seen,
            },
        )

    def restarted_beneath(self, identity: StreamIdentity, error: BaseException) -> bool:
        """Whether Redis restarted under a step that failed with ``error``; if so the committed state is
        reloaded.

        A step can fail on data that a restarted Redis no longer holds (a buffered chunk, say) before
        its commit checks the restart: then the restart is the error to act on. ``error`` is logged
        with it, in case it was a defect of its own that the restart happened to meet.
        """
        try:
            restarted = identity.restarted()
        except REDIS_UNREACHABLE:
            return False
        if restarted:
            log.warning(
                "Redis restarted during the step: redoing it from the last committed step",
                extra={"error": one_line(error)},
            )
            self.reload_committed()
        return restarted


class StartupWait:
    """Start-up steps that wait out a Redis outage, as the running daemon does, rather than end ``alma run``.

    One warning, retries with backoff (:func:`~alma_daemon.infra.outages.wait_out`), the wait shown
    as the phase ``waiting`` for ``Redis at ...`` (the status file that ``alma status`` reads while
    Redis is down, and the progress bar), and past ``daemon.outage_limit_seconds`` the running
    daemon's last line (:class:`~alma_daemon.infra.outages.OutageTooLong`), the phase ``stopped``.
    """

    def __init__(self, outages: OutageBoard, show: Callable[[str, str], None], poll_seconds: float):
        """``show(phase, waiting_for)`` records the phase where ``alma status`` finds it while Redis
        is down; it is called every ``poll_seconds`` during a wait, so the status's heartbeat stays fresh."""
        self.outages = outages
        self.show = show
        self.poll_seconds = poll_seconds

    def run(self, work: Callable[[], T], unreachable: tuple[type[BaseException], ...] = REDIS_UNREACHABLE) -> T:
        """``work()``, redone whole once Redis answers again after it failed with ``unreachable``."""
        try:
            return wait_out(
                work, self.outages, "redis", unreachable, on_wait=self._on_wait, tick_seconds=self.poll_seconds
            )
        except OutageTooLong:
            self.show("stopped", "")
            raise

    def _on_wait(self, outage: Outage | None) -> None:
        if outage is None:
            self.show("starting", "")
        else:
            self.show("waiting", outage.describe())
