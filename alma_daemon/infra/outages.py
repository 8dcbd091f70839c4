"""Outages of the servers the daemon depends on: which are down, since when, why, and for how long.

An outage of Redis or of the Kafka broker is weather, not death (docs/service.md, "Outages"):
the daemon keeps its process, stops taking chunks, reports itself degraded (``/readyz``,
``alma status``, ``alma_server_up`` and ``alma_degraded_since_timestamp_seconds``), waits with
exponential backoff, and continues from the last committed step once the server is back. Only an
outage longer than ``daemon.outage_limit_seconds`` ends it, with :class:`OutageTooLong`.

The ingest thread, the scheduler's health check and the main loop all report here, so the board is
thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from alma_daemon import metrics
from alma_daemon.infra.unreachable import SERVER_KINDS, ServerUnreachable, gave_up_line, outage_line
from alma_daemon.logs import NOTICE, ExplainedError, error_text

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVERS = metrics.SERVERS
#: What redis-py raises when the server is unreachable, restarting, or still loading its data.
REDIS_UNREACHABLE: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
#: First and longest wait between attempts to reach a server that is down.
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 10.0


class OutageTooLong(ExplainedError):
    """A server stayed unreachable for longer than ``daemon.outage_limit_seconds``."""


@dataclass(frozen=True)
class Outage:
    """One server that cannot be reached."""

    server: str
    #: The last error, one line, without credentials (redis-py and kafka-python never print them).
    reason: str
    #: ``time.time()`` of the first failure.
    since: float
    #: Where the server is (host:port), as the config names it; empty where not known.
    address: str = ""

    def describe(self) -> str:
        """``Kafka broker at 127.0.0.1:9092``, for ``alma status``."""
        name = SERVER_KINDS[self.server].name if self.server in SERVER_KINDS else self.server
        return f"{name} at {self.address}" if self.address else name


def redis_retry() -> Retry:
    """redis-py's retry for every command: absorbs a blip of about a second (a failover, a dropped
    connection); a longer outage surfaces as an error, and the daemon rides it out (docs/service.md)."""
    return Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=3)


def retry_delays() -> ExponentialBackoff:
    """The waits between attempts (redis-py's backoff: 0.5 s doubling up to 10 s)."""
    return ExponentialBackoff(cap=RETRY_MAX_SECONDS, base=RETRY_FIRST_SECONDS)


def one_line(error: BaseException) -> str:
    """:func:`~alma_daemon.logs.error_text` on one line, at most 300 characters (status and log fields)."""
    return " ".join(error_text(error).split())[:300]


class OutageBoard:
    """The servers currently down; the daemon is degraded while any is."""

    def __init__(self, limit_seconds: float, addresses: Mapping[str, str] | None = None):
        """``addresses``: where each server is (``redis`` and ``kafka`` to host:port), for messages."""
        self.limit_seconds = limit_seconds
        self.addresses = dict(addresses or {})
        self._lock = threading.Lock()
        self._down: dict[str, Outage] = {}
        for server in SERVERS:
            metrics.SERVER_UP.labels(server).set(1)
        metrics.DEGRADED_SINCE.set(0)

    def down(self, server: str, error: BaseException | str) -> Outage:
        """``server`` failed; an outage already under way keeps its start and takes the new reason."""
        reason = error if isinstance(error, str) else one_line(error)
        with self._lock:
            since = self._down[server].since if server in self._down else time.time()
            self._down[server] = outage = Outage(server, reason, since, self.addresses.get(server, ""))
            self._export()
        return outage

    def up(self, server: str) -> Outage | None:
        """``server`` answered again; returns the outage that ended, if there was one."""
        with self._lock:
            ended = self._down.pop(server, None)
            self._export()
        return ended

    def is_down(self, server: str) -> bool:
        with self._lock:
            return server in self._down

    def outages(self) -> list[Outage]:
        with self._lock:
            return sorted(self._down.values(), key=lambda o: o.since)

    @property
    def degraded(self) -> bool:
        with self._lock:
            return bool(self._down)

    def check_limit(self) -> None:
        """Raise :class:`OutageTooLong` if a server has been down for longer than the limit."""
        now = time.time()
        for outage in self.outages():
            if now - outage.since > self.limit_seconds:
                raise OutageTooLong(
                    gave_up_line(outage.server, outage.address, outage.reason, now - outage.since, self.limit_seconds)
                )

    def as_status(self) -> dict[str, Any]:
        """For ``alma status`` and the local status file."""
        outages = self.outages()
        return {
            "degraded": bool(outages),
            "degraded_since": outages[0].since if outages else None,
            "outages": [
                {"server": o.server, "address": o.address, "reason": o.reason, "since": o.since} for o in outages
            ],
        }

    def _export(self) -> None:
        for server in SERVERS:
            metrics.SERVER_UP.labels(server).set(0 if server in self._down else 1)
        metrics.DEGRADED_SINCE.set(min((o.since for o in self._down.values()), default=0))


def wait_out(
    work: Callable[[], T],
    board: OutageBoard,
    server: str,
    unreachable: tuple[type[BaseException], ...] = REDIS_UNREACHABLE,
    *,
    on_wait: Callable[[Outage | None], None] = lambda outage: None,
    tick_seconds: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``work()``, called again until it no longer fails with ``unreachable``: an outage of ``server``
    ridden out as the running daemon rides one out (one warning, :func:`retry_delays` between tries),
    for the steps that run before the daemon's loop and threads do (start-up).

    Each failure goes on ``board``; past ``board.limit_seconds`` the wait ends with
    :class:`OutageTooLong`. ``on_wait`` is told the outage every ``tick_seconds`` while it lasts (the
    status file's heartbeat), and ``None`` once ``work`` succeeded after one. Redo a whole step, not a
    single command, so that it never mixes what Redis held before a restart with what it holds after.
    """
    delays, failures = retry_delays(), 0
    while True:
        try:
            result = work()
        except unreachable as error:
            outage = board.down(server, unreachable_cause(error))
            if not failures:
                log.warning(
                    outage_line(server, outage.address, error, board.limit_seconds),
                    extra={"server": server, "error": outage.reason, "limit_seconds": board.limit_seconds},
                )
            resume_at = time.monotonic() + delays.compute(failures)
            failures += 1
            while True:
                board.check_limit()
                on_wait(outage)
                left = resume_at - time.monotonic()
                if left <= 0:
                    break
                sleep(min(tick_seconds, left))
            continue
        ended = board.up(server) if failures else None
        if ended is not None:
            log.log(
                NOTICE,
                f"{ended.describe()} answers again",
                extra={"server": server, "outage_seconds": round(time.time() - ended.since, 1)},
            )
            on_wait(None)
        return result


def unreachable_cause(error: BaseException) -> BaseException:
    """The client's own error behind a one-line :class:`~alma_daemon.infra.unreachable.ServerUnreachable`,
    whose fix the outage's messages add themselves; ``error`` itself otherwise."""
    if isinstance(error, ServerUnreachable) and error.__cause__ is not None:
        return error.__cause__
    return error
