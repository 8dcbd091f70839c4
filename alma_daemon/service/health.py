"""The daemon's health: healthy while Redis answers, the ingest thread runs and no server is down.

``/readyz`` answers the same, and ``alma status`` shows it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard
from alma_daemon.service.ingest.worker import IngestWorker

log = logging.getLogger(__name__)


class Health:
    """Health checks (from the scheduler's thread) and reports (after each change of an outage)."""

    def __init__(self, client: Any, outages: OutageBoard, set_ready: Callable[[bool], None] = lambda ready: None):
        """``set_ready`` is told the health after each report (``/readyz``: the metrics part)."""
        self.client = client
        self.outages = outages
        self.set_ready = set_ready
        self.healthy = True
        #: Set while the main loop rides out a Redis outage: it declares Redis back itself, after reloading.
        self.riding_out = threading.Event()

    def check(self, ingest: IngestWorker | None, quiet: bool = False) -> None:
        """Ping Redis, then report."""
        try:
            self.client.ping()
        except REDIS_UNREACHABLE as exc:
            self.outages.down("redis", exc)
        else:
            if not self.riding_out.is_set():
                self.outages.up("redis")
        self.report(ingest, quiet)

    def report(self, ingest: IngestWorker | None, quiet: bool = False) -> None:
        """Update :attr:`healthy` and ``/readyz``; a change is logged unless ``quiet`` (the daemon stopping)."""
        ingest_ok = ingest is not None and ingest.alive
        down = [outage.server for outage in self.outages.outages()]
        healthy = ingest_ok and not down
        if self.healthy != healthy and not quiet:
            # An outage was warned of where it was met, with what the daemon waits for: here it is
            # only the cause of /readyz's answer.
            log.log(
                logging.WARNING if not ingest_ok else logging.INFO,
                "health changed: " + ("healthy" if healthy else "unhealthy (/readyz answers 503)"),
                extra={"healthy": healthy, "ingest": "running" if ingest_ok else "stopped", "down": down},
            )
        self.healthy = healthy
        self.set_ready(healthy)
