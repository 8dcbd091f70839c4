"""Riding out a Redis outage in process (docs/service.md, "Outages").

While Redis cannot be reached the daemon keeps its process, reports itself degraded and retries
with backoff; when Redis answers again it checks that Redis still holds the stream
(``stream_identity.py``) and resumes from the last committed step, exactly as after a crash. An
outage longer than ``daemon.outage_limit_seconds`` ends the run with
:class:`~alma_daemon.infra.outages.OutageTooLong`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from alma_daemon.core.engine import Engine
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard, one_line, retry_delays
from alma_daemon.infra.unreachable import outage_line
from alma_daemon.service.stream_identity import StreamIdentity

log = logging.getLogger(__name__)


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
