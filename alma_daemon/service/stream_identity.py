"""Telling a Redis that kept the stream from one that lost it.

A Redis restarted without persistence, or a new server at the same address, answers as if the
stream had never started. Taken at its word, the daemon would start over at chunk 1 beside model
versions already served. So each stream gets an identity on first start, written both to Redis
(``alma:{s}:identity``) and next to the model versions (``<checkpoint_dir>/<model>/stream-identity.json``).
At start-up and whenever Redis has restarted the two must agree; a Redis without the identity
while the model store has one is refused with :class:`RedisLostTheStream` (docs/service.md, "Outages").

A restart is told by the server's ``run_id``, which changes with every start, rather than by the
errors the daemon saw: redis-py's retry hides a restart that takes less than about a second.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.infra.redis_keys import StreamKeys

IDENTITY_FILE = "stream-identity.json"


class RedisLostTheStream(RuntimeError):
    """Redis does not hold the stream that the model store says was started (or holds another one)."""


class RedisRestarted(redis.ConnectionError):
    """Redis restarted while a step ran: the step is redone from what Redis holds, as after an outage."""


def server_run_id(client: Any) -> str:
    """The answering Redis server's ``run_id``: a new one at every start of the server."""
    return str(client.info("server")["run_id"])


class StreamIdentity:
    """The stream's identity, as Redis and the model store each hold it."""

    def __init__(self, client: Any, keys: StreamKeys, store: CheckpointStore, redis_name: str):
        self.client = client
        self.keys = keys
        self.store = store
        #: Where Redis is, for messages (host:port or the embedded database file; never credentials).
        self.redis_name = redis_name
        self.marker = store.folder / IDENTITY_FILE
        self.value: str | None = None
        self._run_id: str | None = None

    def establish(self) -> str:
        """At start-up: check that Redis and the model store belong to the same stream, or create the
        identity of a new stream; raises :class:`RedisLostTheStream` if Redis has lost it."""
        in_redis = self._in_redis()
        on_disk = self._on_disk()
        if in_redis is None and on_disk is not None:
            # At start-up there are two stories: Redis lost the stream, or this model store is another
            # deployment's (every example config uses the same default daemon.checkpoint_dir).
            raise RedisLostTheStream(
                f"Redis at {self.redis_name} holds no stream {self.keys.stream!r}, but {self.marker} records it "
                f"(identity {on_disk}): Redis has lost its data (it restarted without persistence, or is another "
                f"server), or daemon.checkpoint_dir is another deployment's model store. Restore Redis's data "
                f"(AOF or RDB) and start again, or set another daemon.checkpoint_dir for a new stream; never start "
                f"a stream over on top of its model versions"
            )
        if in_redis is None:
            versions = self.store.versions()
            if versions and self.client.get(self.keys.engine) is None:
                raise RedisLostTheStream(
                    f"Redis at {self.redis_name} holds no state for stream {self.keys.stream!r}, but {self.store.folder} "
                    f"holds model versions {versions[0]}..{versions[-1]}: Redis has lost its data, or another "
                    f"stream's model store is configured; restore Redis, or set another daemon.checkpoint_dir"
                )
            # A new stream, or one started before identities existed (its engine state is in Redis).
            in_redis = uuid.uuid4().hex
            if not self.client.set(self.keys.identity, in_redis, nx=True):
                in_redis = self._in_redis()
                assert in_redis is not None  # SET NX failed: another daemon has just set it
        if on_disk is not None and on_disk != in_redis:
            raise RedisLostTheStream(
                f"Redis at {self.redis_name} holds stream {self.keys.stream!r} with identity {in_redis}, but "
                f"{self.marker} belongs to identity {on_disk}: Redis and daemon.checkpoint_dir are of different "
                f"deployments"
            )
        if on_disk is None:
            write_json_atomic(
                self.marker, {"stream": self.keys.stream, "identity": in_redis, "created_at": time.time()}
            )
        self.value = in_redis
        self._run_id = self._server_run_id()
        return in_redis

    def restarted(self) -> bool:
        """Whether Redis has restarted since the last call (or :meth:`establish`); raises
        :class:`RedisLostTheStream` if it came back without the stream."""
        run_id = self._server_run_id()
        if run_id == self._run_id:
            return False
        self.verify()
        self._run_id = run_id
        return True

    def verify(self) -> None:
        """Redis must still hold the identity established at start-up."""
        in_redis = self._in_redis()
        if in_redis != self.value:
            raise RedisLostTheStream(
                f"Redis at {self.redis_name} came back without stream {self.keys.stream!r} (identity {self.value}, "
                f"recorded in {self.marker}): it restarted empty (no persistence) or is another server. Restore its "
                f"data (AOF or RDB) and start the daemon again; never start a stream over on top of its model versions"
            )

    def _server_run_id(self) -> str:
        return server_run_id(self.client)

    def _in_redis(self) -> str | None:
        raw = self.client.get(self.keys.identity)
        return raw.decode() if isinstance(raw, bytes) else raw

    def _on_disk(self) -> str | None:
        if not self.marker.is_file():
            return None
        return str(json.loads(Path(self.marker).read_text())["identity"])
