"""The daemon's heartbeat: its phase, pid, memory, health and outages, in ``alma:{s}:daemon`` (read by
``alma status``) and in ``<daemon.state_dir>/daemon-status.json`` (read by ``alma status`` while
Redis is down)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard
from alma_daemon.infra.redis_keys import StreamKeys

if TYPE_CHECKING:
    # Only named here: ``alma status`` reads STATUS_FILE without the ingest's decoding (torch).
    from alma_daemon.service.ingest.worker import IngestWorker

#: ``<daemon.state_dir>/STATUS_FILE``: the daemon's status, readable by ``alma status`` while Redis is down.
STATUS_FILE = "daemon-status.json"


class Heartbeat:
    """Writes the daemon's phase as it changes and its whole status on every beat."""

    def __init__(self, client: Any, keys: StreamKeys, path: Path, outages: OutageBoard):
        self.client = client
        self.keys = keys
        self.path = path
        self.outages = outages
        self.phase = "starting"
        #: While the phase is ``waiting``: what for (``chunk 13``, ``the swap of version 12``), and since when.
        self.waiting_for = ""
        self.since = time.time()
        self._last_wait = ("", self.since)

    def started(self, bound: dict[str, Any] | None = None) -> None:
        """The daemon started; ``bound`` is the freshness bound it runs by ({chunks, seconds}), which
        ``alma status`` shows whatever config it is itself given."""
        fields = {"pid": os.getpid(), "started_at": f"{time.time():.3f}"}
        if bound is not None:
            fields["freshness_bound"] = json.dumps(bound)
        self.client.hset(self.keys.daemon, mapping=fields)

    def set_phase(self, phase: str, waiting_for: str = "", *, redis_down: bool = False) -> None:
        """Enter ``phase`` (``waiting_for`` says what a ``waiting`` phase waits for); staying in the
        same phase keeps its start, which ``alma status`` counts from, and so does going back to the
        last wait (the same ``waiting_for``) after another phase. ``redis_down``: the phase goes
        to the status file only (the next beat), rather than to a Redis that does not answer."""
        if (phase, waiting_for) == (self.phase, self.waiting_for):
            return
        # A wait that a short phase interrupted (a policy check) goes on: it keeps its start.
        resumed = waiting_for and waiting_for == self._last_wait[0]
        self.since = self._last_wait[1] if resumed else time.time()
        self.phase, self.waiting_for = phase, waiting_for
        if waiting_for or phase.startswith("processing"):  # work in between ends the wait
            self._last_wait = (waiting_for, self.since)
        if redis_down:
            return
        try:
            self.client.hset(self.keys.daemon, mapping=self._phase_fields())
        except REDIS_UNREACHABLE as exc:
            # Status only: the main loop notices the outage at its next Redis call.
            self.outages.down("redis", exc)

    def _phase_fields(self) -> dict[str, Any]:
        return {"phase": self.phase, "waiting_for": self.waiting_for, "phase_since": f"{self.since:.3f}"}

    @property
    def stopping(self) -> bool:
        return self.phase in ("stopping", "stopped")

    def write_redis(self, healthy: bool, ingest: IngestWorker | None) -> None:
        """The status in Redis (raises when Redis is unreachable)."""
        self.client.hset(self.keys.daemon, mapping=self.status(healthy, ingest))

    def write_file(self, healthy: bool, ingest: IngestWorker | None) -> None:
        write_json_atomic(self.path, self.status(healthy, ingest))

    def status(self, healthy: bool, ingest: IngestWorker | None) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            **self._phase_fields(),
            "heartbeat": f"{time.time():.3f}",
            "rss_bytes": psutil.Process().memory_info().rss,
            "healthy": int(healthy),
            "ingest": ingest_state(ingest),
            "degraded": json.dumps(self.outages.as_status()),
        }


class Phases:
    """The daemon's phase as it changes: to the heartbeat, and a wait that is shown to ``on_waiting``
    too (the progress bar)."""

    def __init__(self, heartbeat: Heartbeat, on_waiting: Callable[[str], None] = lambda waiting_for: None):
        self.heartbeat = heartbeat
        #: Told what the daemon waits for whenever that changes (empty: it works).
        self.on_waiting = on_waiting
        self._shown_wait = ""

    def set(self, phase: str, waiting_for: str = "", *, shown: bool = False, redis_down: bool = False) -> None:
        """Enter ``phase`` (:meth:`Heartbeat.set_phase`).

        A wait ``shown`` goes to :attr:`on_waiting` too (a server down, a missing chunk, the last
        swap; not the next chunk, which the bar's stillness says) and stays there until another wait
        or a chunk replaces it: a policy check in between does not."""
        show = self._shown_wait
        if waiting_for or phase.startswith("processing"):
            show = waiting_for if shown else ""
        if show != self._shown_wait:
            self._shown_wait = show
            self.on_waiting(show)
        self.heartbeat.set_phase(phase, waiting_for, redis_down=redis_down)

    def show_redis_down(self, phase: str, waiting_for: str) -> None:
        """A start-up step's wait for Redis (``redis_outage.StartupWait``), shown, and in the status file
        at once, before the ingest thread runs."""
        self.set(phase, waiting_for, shown=True, redis_down=True)
        self.heartbeat.write_file(False, None)


def ingest_state(ingest: IngestWorker | None) -> str:
    if ingest is None or not ingest.alive:
        return "stopped"
    return "paused" if ingest.paused else "running"
