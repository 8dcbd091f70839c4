"""The Redis-stream transport (the embedded default, so a new user needs no Kafka broker):
:class:`RedisStreamPublisher` adds wire records to a stream, :class:`RedisStreamSource` reads them.

The stream is named like the Kafka topic (``kafka.topic``). Each entry is one wire record with
fields ``key`` (absent for a record without key), ``value`` and ``headers`` (JSON list of
``[name, value]`` pairs, values as latin-1 text so every byte survives). Entries the ingest has
stored are deleted from the stream, so its length is the ingest lag and its memory stays bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alma_daemon.data.wire import WireRecord
from alma_daemon.infra.outages import REDIS_UNREACHABLE
from alma_daemon.transports.source import SourceRecord

if TYPE_CHECKING:
    from alma_daemon.config import Config

#: The one position of a Redis stream in the offsets hash.
POSITION = "stream"


def encode_entry(record: WireRecord) -> dict[str, bytes]:
    """The stream entry fields for one wire record."""
    headers = json.dumps([[name, value.decode("latin-1")] for name, value in record.headers])
    fields = {"value": record.value, "headers": headers.encode()}
    # Redis has no null: an event record without key leaves the field out, and decode_entry reads None.
    return fields if record.key is None else {"key": record.key, **fields}


def decode_entry(
    fields: dict[bytes, bytes],
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None, str | None]:
    """``(key, value, headers, problem)`` of an entry; ``problem`` explains unreadable headers."""
    raw = fields.get(b"headers")
    headers = None
    problem = None
    if raw is not None:
        # RecursionError: deeply nested JSON. Uncaught, it would stop ingest on this entry at every start.
        try:
            pairs = json.loads(raw)
            headers = [(str(name), str(value).encode("latin-1")) for name, value in pairs]
        except (ValueError, TypeError, UnicodeEncodeError, RecursionError):
            problem = f"headers field is not a JSON list of [name, value] pairs: {raw[:80]!r}"
    return fields.get(b"key"), fields.get(b"value"), headers, problem


class RedisStreamSource:
    """One Redis stream read with XREAD from the last stored entry id."""

    server = "redis"
    unreachable = REDIS_UNREACHABLE

    def __init__(self, client: Any, name: str):
        self.client = client
        self.name = name
        self.last_id = "0-0"

    @classmethod
    def from_config(cls, config: Config, client: Any) -> RedisStreamSource:
        """The stream ``kafka.topic`` on ``client`` (the daemon's Redis)."""
        return cls(client, config.kafka.topic)

    def seek(self, offsets: dict[str, str]) -> None:
        self.last_id = offsets.get(POSITION, "0-0")
        self._drop_through(self.last_id)

    def poll(self, timeout: float, max_records: int) -> list[SourceRecord]:
        answer = self.client.xread({self.name: self.last_id}, count=max_records, block=max(1, int(timeout * 1000)))
        records = []
        for _, entries in answer or []:
            for entry_id, fields in entries:
                entry = entry_id.decode()
                key, value, headers, problem = decode_entry(fields)
                records.append(SourceRecord(POSITION, entry, key, value, headers, f"{self.name}@{entry}", problem))
                self.last_id = entry
        return records

    def acknowledge(self, offsets: dict[str, str]) -> None:
        """The records up to the stored offset are in Redis: drop them from the transport stream."""
        if POSITION in offsets:
            self._drop_through(offsets[POSITION])

    def _drop_through(self, entry_id: str) -> None:
        if entry_id == "0-0":
            return
        self.client.xtrim(self.name, minid=entry_id, approximate=False)
        self.client.xdel(self.name, entry_id)

    def lag(self) -> int | None:
        return int(self.client.xlen(self.name))

    def close(self) -> None:
        """The client belongs to the daemon, which closes it."""


class RedisStreamPublisher:
    """Publishes to a Redis stream (the embedded transport), waiting while the daemon is behind.

    Kafka keeps what consumers have not read on disk; a Redis stream keeps it in memory, so the
    publisher holds back while more than ``max_queued`` records are unread.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        max_queued: int = 64,
        poll_seconds: float = 0.2,
        stop: Callable[[], bool] = lambda: False,
    ):
        self.client = client
        self.name = name
        self.max_queued = max_queued
        self.poll_seconds = poll_seconds
        self.stop = stop

    def send(self, records: list[WireRecord]) -> None:
        while self.client.xlen(self.name) > self.max_queued and not self.stop():
            time.sleep(self.poll_seconds)
        pipe = self.client.pipeline(transaction=False)
        for record in records:
            pipe.xadd(self.name, encode_entry(record))
        pipe.execute()

    def close(self) -> None:
        """XADD is acknowledged when it returns; the client belongs to the caller."""
