"""The Redis side of ingest: one MULTI/EXEC per batch of records, offsets included.

Everything a batch changes (new parts, the chunks they complete, dead letters, counters and the
offsets reached) is written in one transaction, so after a crash the stored offsets say exactly
which records are in Redis: the consumer seeks there and nothing is lost or stored twice.

``queued_bytes`` in ``alma:{s}:ingest`` counts the bytes of complete chunks the engine has not
consumed (what ingest pauses on).
``refused_chunks`` there lists the chunks the assembler refused or gave up as incomplete (ids,
space-separated), so a restart keeps skipping their later parts. ``alma:{s}:completed`` holds the
ids of the chunks completed within the order guard's window, so a restart still treats their
re-sent parts as duplicates. A chunk's ``arrived_at`` is kept in its hash, so a restart ages an
incomplete chunk from its first part, as an uninterrupted ingest does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from alma_daemon.data.wire import DecodedPart, RejectedRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.assembler import Assembler, ChunkProgress, part_dtype
from alma_daemon.service.redis_tx import dead_letter, text_hash, watched_transaction
from alma_daemon.service.stream_identity import RedisRestarted, server_run_id
from alma_daemon.transports.source import SourceRecord


@dataclass(frozen=True)
class Segment:
    """Examples of an event stream appended to its open chunk as part ``part`` (``cutter.py``)."""

    chunk_id: int
    part: int
    value: bytes
    examples: int


@dataclass
class IngestBatch:
    """The changes of one poll, written together by :meth:`IngestStore.commit`."""

    parts: list[tuple[DecodedPart, SourceRecord]] = field(default_factory=list)
    completed: dict[int, ChunkProgress] = field(default_factory=dict)
    #: Incomplete chunks given up, in order: (chunk id, its progress, why); one dead letter each.
    abandoned: list[tuple[int, ChunkProgress, RejectedRecord]] = field(default_factory=list)
    rejected: list[tuple[SourceRecord, RejectedRecord]] = field(default_factory=list)
    offsets: dict[str, str] = field(default_factory=dict)
    #: The assembler's refused chunks after this batch, where the batch changed them.
    refused: set[int] | None = None
    #: After a batch that completed chunks: the newest completed id, and the oldest id the order
    #: guard's window still holds (older completed ids are forgotten).
    newest_completed: int | None = None
    window_floor: int | None = None

    #: Event streams: the parts appended to open chunks, and the open chunk's state after the batch
    #: (``alma:{s}:ingest`` fields), when the batch changed it.
    segments: list[Segment] = field(default_factory=list)
    open_chunk: dict[str, str] | None = None
    #: When the batch was assembled (ingest's clock): a new chunk's ``arrived_at``.
    at: float = field(default_factory=time.time)

    def __bool__(self) -> bool:
        return bool(self.offsets) or self.open_chunk is not None or bool(self.abandoned)

    def abandon(self, chunk_id: int, progress: ChunkProgress, why: RejectedRecord) -> None:
        """Give up an incomplete chunk: its parts in this batch are not written, earlier ones are deleted.

        The deletion runs first in the transaction, so a later part in this batch may start the
        chunk again.
        """
        self.parts = [(part, record) for part, record in self.parts if part.chunk_id != chunk_id]
        self.abandoned.append((chunk_id, progress, why))


class IngestStore:
    """Reads and writes the ingest keys of one stream (parts, chunk hashes, ready, offsets, dead)."""

    def __init__(self, client: Any, keys: StreamKeys):
        self.client = client
        self.keys = keys
        self.follow_server()

    def follow_server(self) -> None:
        """Take the Redis server answering now as the one whose state ingest holds in memory.

        Call it before reading that state (at start-up, on resync). A commit to another server (a
        restart, which may have lost the last writes) fails with :class:`RedisRestarted` instead, so
        ingest rereads Redis and seeks the transport back to the offsets it holds: a restart that
        redis-py's retry hides, or that no error reached this thread for, would otherwise skip the
        lost records for good.
        """
        self._run_id = server_run_id(self.client)

    def open_chunk_fields(self) -> dict[str, str]:
        """The ingest hash, where an event stream keeps its open chunk (``cutter.OpenChunk``)."""
        return text_hash(self.client, self.keys.ingest)

    def offsets(self) -> dict[str, str]:
        return text_hash(self.client, self.keys.offsets)

    def queued_bytes(self) -> int:
        """Bytes of complete chunks not yet consumed by the engine (what backpressure bounds)."""
        return int(self.client.hget(self.keys.ingest, "queued_bytes") or 0)

    def recount_queued_bytes(self) -> int:
        """Set ``queued_bytes`` from the ready chunks themselves, and return it.

        A count left by earlier versions, which counted incomplete chunks too, could keep ingest
        paused for good. Call it before the engine consumes chunks (the daemon makes its ingest
        worker before its first step; one daemon runs per stream): the engine's step commit lowers
        this count, and nothing here guards against that.
        """
        ready = self.client.zrange(self.keys.ready, 0, -1)
        total = sum(int(self.client.hget(self.keys.chunk(int(c)), "bytes") or 0) for c in ready)
        self.client.hset(self.keys.ingest, "queued_bytes", total)
        return total

    def load_assembler(
        self,
        max_bytes: int | None = None,
        max_ahead: int | None = None,
        max_age: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> Assembler:
        """The assembler as the last committed batch left it, its incomplete chunks within ``max_bytes``,
        its chunk ids at most ``max_ahead`` above the newest completed one, and each incomplete chunk
        given up ``max_age`` seconds after its first part arrived, by ``clock`` (``Assembler.expire``)."""
        (refused,) = self.client.hmget(self.keys.ingest, ["refused_chunks"])
        completed = [int(c) for c in self.client.zrange(self.keys.completed, 0, -1)]
        in_progress = {}
        for member in self.client.zrange(self.keys.assembling, 0, -1):
            chunk_id = int(member)
            fields = text_hash(self.client, self.keys.chunk(chunk_id))
            in_progress[chunk_id] = ChunkProgress(
                parts=int(fields["parts"]),
                dtype=fields["dtype"],
                got={int(k.removeprefix("got:")) for k in fields if k.startswith("got:")},
                examples=int(fields.get("examples", 0)),
                bytes=int(fields.get("bytes", 0)),
                arrived_at=float(fields["arrived_at"]) if "arrived_at" in fields else clock(),
            )
        return Assembler(
            self.keys.stream,
            in_progress,
            completed,
            max_bytes,
            refused=(int(c) for c in (refused or b"").split()),
            max_ahead=max_ahead,
            max_age=max_age,
            clock=clock,
        )

    def commit(self, batch: IngestBatch) -> None:
        """Write ``batch`` in one MULTI/EXEC, or raise :class:`RedisRestarted` and write nothing."""
        with watched_transaction(self.client, self.keys.offsets) as pipe:
            # After the WATCH: a restart from here on breaks the watched connection, so EXEC fails.
            if server_run_id(self.client) != self._run_id:
                raise RedisRestarted("Redis restarted since ingest read its state; ingest resyncs from what it holds")
            self._stage(pipe, batch)
            pipe.execute()

    def _stage(self, pipe: Any, batch: IngestBatch) -> None:
        """Queue the writes of ``batch`` on ``pipe``, the abandoned chunks' deletions first."""
        keys = self.keys
        now = f"{batch.at:.3f}"
        for chunk_id, progress, why in batch.abandoned:
            pipe.zrem(keys.assembling, chunk_id)
            pipe.delete(keys.chunk(chunk_id), *(keys.part(chunk_id, i) for i in progress.got))
            dead_letter(pipe, keys, why.reason, why.detail, f"chunk {chunk_id}")
        for part, record in batch.parts:
            assert record.value is not None
            chunk_key = keys.chunk(part.chunk_id)
            pipe.set(keys.part(part.chunk_id, part.part), record.value)
            pipe.hset(chunk_key, mapping={"parts": part.parts, f"got:{part.part}": 1, "dtype": part_dtype(part)})
            pipe.hsetnx(chunk_key, "first_offset", record.origin)
            pipe.hsetnx(chunk_key, "arrived_at", now)
            pipe.hincrby(chunk_key, "received", 1)
            pipe.hincrby(chunk_key, "examples", part.examples)
            pipe.hincrby(chunk_key, "bytes", len(record.value))
            pipe.zadd(keys.assembling, {part.chunk_id: part.chunk_id})
        for segment in batch.segments:
            chunk_key = keys.chunk(segment.chunk_id)
            pipe.set(keys.part(segment.chunk_id, segment.part), segment.value)
            pipe.hset(chunk_key, mapping={"parts": segment.part + 1, f"got:{segment.part}": 1, "dtype": "float32"})
            pipe.hsetnx(chunk_key, "arrived_at", now)
            pipe.hincrby(chunk_key, "examples", segment.examples)
            pipe.hincrby(chunk_key, "bytes", len(segment.value))
            pipe.zadd(keys.assembling, {segment.chunk_id: segment.chunk_id})
        if batch.open_chunk is not None:
            pipe.hset(keys.ingest, mapping=batch.open_chunk)
        for chunk_id, progress in batch.completed.items():
            pipe.zrem(keys.assembling, chunk_id)
            pipe.zadd(keys.ready, {chunk_id: chunk_id})
            pipe.zadd(keys.completed, {chunk_id: chunk_id})
            pipe.hincrby(keys.ingest, "queued_bytes", progress.bytes)
            pipe.hincrby(keys.ingest, "chunks_received", 1)
            pipe.hincrby(keys.ingest, "examples_received", progress.examples)
        if batch.newest_completed is not None:
            pipe.hset(keys.ingest, "last_completed", batch.newest_completed)
        if batch.window_floor is not None:
            pipe.zremrangebyscore(keys.completed, "-inf", f"({batch.window_floor}")
        for record, rejection in batch.rejected:
            dead_letter(
                pipe,
                keys,
                rejection.reason,
                rejection.detail,
                record.origin,
                key=record.key,
                value=record.value,
                headers=record.headers,
            )
        if batch.refused is not None:
            pipe.hset(keys.ingest, "refused_chunks", " ".join(str(c) for c in sorted(batch.refused)))
        if batch.offsets:
            pipe.hset(keys.offsets, mapping=batch.offsets)
