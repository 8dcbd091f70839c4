"""``alma run``'s own parts, which its daemon's graph starts before the daemon's parts (``Daemon(outer=...)``):
the model store's lock (``store_lock.py``), Redis (``embedded_redis.py``), then these two.

Both are up once Redis answers: the progress bar, which starts at the chunks processed before a restart
and is closed before any error is printed (so none shares its line); and the status printed at a
clean exit, read after the daemon's parts stopped (its phase ``stopped``), before Redis closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alma_daemon.config import Config
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability.progress import ProgressBar
from alma_daemon.service.components import Component, started
from alma_daemon.service.embedded_redis import RedisConnection
from alma_daemon.service.status import engine_counters, freshness_bound, read_status, serving_state


class ProgressPart(Component, EngineObserver):
    """The progress bar over the stream's chunks, an observer of the engine."""

    name = "progress"
    requires = ("redis",)

    def __init__(self, config: Config, redis: RedisConnection, total: int | None, enabled: bool = True):
        self.keys = StreamKeys(config.daemon.stream)
        self.redis = redis
        self.total = total
        self.enabled = enabled
        self.bar: ProgressBar | None = None

    def start(self) -> None:
        client = self.redis.client
        # The bar starts at the chunks processed before a restart, which the engine's restore reads too.
        processed = int(self.redis.wait_out(lambda: engine_counters(client, self.keys)).get("chunks_seen", 0))
        self.bar = ProgressBar(self.total, enabled=self.enabled, initial=processed)

    def stop(self) -> None:
        started(self.bar, self.name).close()

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        started(self.bar, self.name).on_step(record, engine)

    def show_waiting(self, waiting_for: str) -> None:
        """What the daemon waits for, before the bar (the daemon's ``on_waiting``)."""
        started(self.bar, self.name).show_waiting(waiting_for)


class ExitStatus(Component):
    """The stream's status (``alma status``) as the daemon left it, read at the stop when ``wanted()``
    (the run ended cleanly)."""

    name = "exit status"
    requires = ("redis",)

    def __init__(self, config: Config, redis: RedisConnection, wanted: Callable[[], bool]):
        self.config = config
        self.redis = redis
        self.wanted = wanted
        self._status: dict[str, Any] | None = None
        self._error: Exception | None = None

    def stop(self) -> None:
        if not self.wanted():
            return
        config = self.config
        try:
            self._status = read_status(
                self.redis.client,
                StreamKeys(config.daemon.stream),
                config.daemon.poll_seconds,
                serving_state(config),
                freshness_bound(config),
            )
        except Exception as exc:  # raised by status() in the command, as a failed read would be
            self._error = exc

    def status(self) -> dict[str, Any]:
        """The status read at the stop; the error if the read failed."""
        if self._error is not None:
            raise self._error
        return started(self._status, self.name)
