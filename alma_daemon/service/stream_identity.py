"""Telling a Redis that kept the stream from one that lost it.

A Redis restarted without persistence, or a new server at the same address, answers as if the
stream had never started. Taken at its word, the daemon would start over at chunk 1 beside model
versions already served. So each stream gets an identity on first start, written both to Redis
(``alma:{s}:identity``) and next to the model versions (``<checkpoint_dir>/<model>/stream-identity.json``).
At start-up and whenever Redis has restarted the two must agree; a Redis without the identity
while the model store has one is refused: with :class:`ForeignModelStore` when the store was written
against another Redis (the record names it), else with :class:`RedisLostTheStream`
(docs/service.md, "Outages").

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
from alma_daemon.infra.redis_keys import REDIS_ID, StreamKeys

IDENTITY_FILE = "stream-identity.json"


class RedisLostTheStream(RuntimeError):
    """Redis does not hold the stream that the model store says was started (or holds another one)."""


class ForeignModelStore(RuntimeError):
    """``daemon.checkpoint_dir`` is the model store of a stream on another Redis, and this Redis holds
    no such stream: the configuration, not Redis, is at fault."""


class RedisRestarted(redis.ConnectionError):
    """Redis restarted while a step ran: the step is redone from what Redis holds, as after an outage."""


def server_run_id(client: Any) -> str:
    """The answering Redis server's ``run_id``: a new one at every start of the server."""
    return str(client.info("server")["run_id"])


def describe_location(location: str) -> str:
    """A location as :func:`alma_daemon.service.embedded_redis.redis_location` writes it, for messages."""
    if location.startswith("embedded:"):
        return f"the embedded Redis of {location.removeprefix('embedded:')}"
    return location


class StreamIdentity:
    """The stream's identity, as Redis and the model store each hold it.

    The model store's record also names the Redis it was written against: its location (``redis``,
    from :func:`alma_daemon.service.embedded_redis.redis_location`) and the database's own identity
    (``redis_id``, the key ``alma:redis-id``). A Redis without the stream is then told apart: another
    Redis than the store's (:class:`ForeignModelStore`: set ``daemon.checkpoint_dir``), or the store's
    own Redis, which has lost its data or had the stream's keys deleted (:class:`RedisLostTheStream`).
    """

    def __init__(
        self, client: Any, keys: StreamKeys, store: CheckpointStore, redis_name: str, redis_location: str | None = None
    ):
        self.client = client
        self.keys = keys
        self.store = store
        #: Where Redis is, for messages (host:port or the embedded database file; never credentials).
        self.redis_name = redis_name
        #: Where Redis is, as recorded beside the model versions (scheme, host, port and database; never
        #: credentials); None: not recorded.
        self.redis_location = redis_location
        self.marker = store.folder / IDENTITY_FILE
        self.value: str | None = None
        self._run_id: str | None = None

    def establish(self) -> str:
        """At start-up: check that Redis and the model store belong to the same stream, or create the
        identity of a new stream; raises :class:`ForeignModelStore` if the model store is another
        Redis's, :class:`RedisLostTheStream` if Redis has lost the stream."""
        in_redis = self._in_redis()
        record = self._record()
        on_disk = None if record is None else str(record["identity"])
        if in_redis is None and record is not None:
            raise self._no_stream(record)
        if in_redis is None:
            versions = self.store.versions()
            if versions and self.client.get(self.keys.engine) is None:
                raise RedisLostTheStream(
                    f"Redis at {self.redis_name} holds no state for stream {self.keys.stream!r}, but {self.store.folder} "
                    f"holds model versions {versions[0]}..{versions[-1]}: Redis has lost its data, or another "
                    f"stream's model store is configured; restore Redis, or set daemon.checkpoint_dir to a new "
                    f"directory for a new stream"
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
                f"deployments; set daemon.checkpoint_dir to the store of this Redis's stream, or to a new "
                f"directory together with another daemon.stream"
            )
        redis_id = self._redis_id(create=True)
        wanted = {"stream": self.keys.stream, "identity": in_redis, "redis": self.redis_location, "redis_id": redis_id}
        if record is None or any(record.get(key) != value for key, value in wanted.items()):
            # A new store, one written before the record named its Redis, or a stream whose Redis moved
            # (its data with it): the record names the Redis that holds the stream now.
            created = record.get("created_at") if record is not None else None
            write_json_atomic(self.marker, {**wanted, "created_at": created or time.time()})
        self.value = in_redis
        self._run_id = self._server_run_id()
        return in_redis

    def _no_stream(self, record: dict[str, Any]) -> RuntimeError:
        """Why this Redis holds no stream that the model store records: a store of another Redis, or
        this Redis lost its data (restarted empty) or the stream's keys (deleted)."""
        stream, on_disk = self.keys.stream, record["identity"]
        theirs, ours = record.get("redis_id"), self._redis_id(create=False)
        where = record.get("redis")
        if (ours is not None and theirs is not None and ours != theirs) or (
            ours is None and where is not None and self.redis_location is not None and where != self.redis_location
        ):
            other = describe_location(where) if where else "another Redis"
            if ours is not None and theirs is not None and (where is None or where == self.redis_location):
                other = f"another Redis at this address (Redis id {theirs}; this one's is {ours})"
            return ForeignModelStore(
                f"daemon.checkpoint_dir: the model store {self.store.folder} belongs to stream {stream!r} on "
                f"{other}, and Redis at {self.redis_name} holds no such stream (its record: {self.marker}). Set "
                f"daemon.checkpoint_dir to a new directory to start stream {stream!r} on this Redis (and "
                f"daemon.state_dir, for its results and status), or redis.url to the Redis the store belongs to"
            )
        if ours is not None and ours == theirs:
            return RedisLostTheStream(
                f"Redis at {self.redis_name} is the Redis {self.marker} was written against (Redis id {ours}), but "
                f"holds no stream {stream!r} any more (identity {on_disk}): its keys were deleted. Restore them "
                f"(AOF or RDB backup) and start again, or set daemon.checkpoint_dir to a new directory for a new "
                f"stream; never start a stream over on top of its model versions"
            )
        if where is None and theirs is None:
            # A record written before it named its Redis: both stories stay open.
            return RedisLostTheStream(
                f"Redis at {self.redis_name} holds no stream {stream!r}, but {self.marker} records it "
                f"(identity {on_disk}): Redis has lost its data (it restarted without persistence, or is another "
                f"server), or daemon.checkpoint_dir is another deployment's model store. Restore Redis's data "
                f"(AOF or RDB) and start again, or set daemon.checkpoint_dir to a new directory for a new stream; "
                f"never start a stream over on top of its model versions"
            )
        return RedisLostTheStream(
            f"Redis at {self.redis_name} holds no stream {stream!r}, but {self.marker} records it on this same "
            f"Redis (identity {on_disk}): Redis has lost its data (it restarted without persistence, or an empty "
            f"server took its place). Restore its data (AOF or RDB) and start again; to start a new stream on it "
            f"instead, set daemon.checkpoint_dir to a new directory. Never start a stream over on top of its "
            f"model versions"
        )

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

    def _redis_id(self, create: bool) -> str | None:
        """This Redis database's own identity (``alma:redis-id``), made here if ``create`` and missing."""
        if create:
            self.client.set(REDIS_ID, uuid.uuid4().hex, nx=True)
        raw = self.client.get(REDIS_ID)
        return raw.decode() if isinstance(raw, bytes) else raw

    def _record(self) -> dict[str, Any] | None:
        if not self.marker.is_file():
            return None
        return dict(json.loads(Path(self.marker).read_text()))
