"""The Redis buffer: complete chunks waiting for the engine, and the engine's ChunkBuffer.

:class:`ReadyChunks` is where ingest leaves complete chunks (``alma:{s}:ready`` plus their parts);
the daemon takes them in id order. :class:`RedisBuffer` implements the ``ChunkBuffer`` protocol of
``chunk_buffer.py`` so the engine uses it exactly as the simulator's ``MemoryBuffer``.

Crash safety: the engine's changes to the buffer (a chunk added, chunks marked trained) are kept in
memory until :meth:`RedisBuffer.stage_commit` adds them to the daemon's one MULTI/EXEC that also
removes the chunk from ``ready`` and saves the engine state. A run killed before that transaction
restarts from the previous step as if the interrupted one never happened. The chunk data itself is
written eagerly (``alma:{s}:split:<chunk>``): it is a pure function of the chunk, so rewriting it
when the step is redone is harmless.
"""

from __future__ import annotations

from typing import Any

import safetensors.torch

from alma_daemon.data.datasets import DatasetError
from alma_daemon.data.streams import Chunk, SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import sequences
from alma_daemon.data.wire import DecodedPart, RejectedRecord, assemble_chunk
from alma_daemon.infra.redis_keys import StreamKeys


class ReadyChunks:
    """Complete chunks that ingest stored and the engine has not consumed yet.

    A text stream's chunk is a run of tokens; :meth:`load` cuts it into sequences of ``seq_len``
    tokens (and their next tokens), as the simulator does.
    """

    def __init__(self, client: Any, keys: StreamKeys, seq_len: int | None = None):
        self.client = client
        self.keys = keys
        self.seq_len = seq_len

    def ids(self) -> list[int]:
        """The ready chunk ids, ascending."""
        return [int(c) for c in self.client.zrange(self.keys.ready, 0, -1)]

    def lowest_assembling(self) -> int | None:
        """The lowest id of a chunk with parts stored but not complete, or None."""
        ids = self.client.zrange(self.keys.assembling, 0, 0)
        return int(ids[0]) if ids else None

    def count(self) -> int:
        return int(self.client.zcard(self.keys.ready))

    def load(self, chunk_id: int) -> Chunk:
        """Assemble the chunk from its parts; raises ``RejectedRecord`` if they do not fit together."""
        parts = int(self.client.hget(self.keys.chunk(chunk_id), "parts") or 0)
        values = self.client.mget([self.keys.part(chunk_id, i) for i in range(parts)]) if parts else []
        if not values or any(v is None for v in values):
            raise RejectedRecord("part_numbering", f"chunk {chunk_id} is marked ready but parts are missing")
        decoded = []
        for i, value in enumerate(values):
            tensors = safetensors.torch.load(value)
            decoded.append(
                DecodedPart(
                    self.keys.stream,
                    chunk_id,
                    i,
                    parts,
                    x=tensors.get("x"),
                    y=tensors.get("y"),
                    tokens=tensors.get("tokens"),
                )
            )
        assembled = assemble_chunk(decoded)
        if isinstance(assembled, tuple):
            return Chunk(chunk_id, LabeledData(*assembled))
        if self.seq_len is None:
            raise RejectedRecord("decode", f"chunk {chunk_id} holds text tokens; this daemon reads a labeled stream")
        try:
            return Chunk(chunk_id, sequences(assembled, self.seq_len))
        except DatasetError as error:
            raise RejectedRecord("shape", f"chunk {chunk_id}: {error}") from error

    def stage_consume(self, pipe: Any, chunk_id: int) -> None:
        """Add to ``pipe``: the chunk leaves ``ready`` and its parts are deleted."""
        fields = self.client.hmget(self.keys.chunk(chunk_id), ["parts", "bytes"])
        parts, size = (int(v or 0) for v in fields)
        pipe.zrem(self.keys.ready, chunk_id)
        pipe.delete(self.keys.chunk(chunk_id), *(self.keys.part(chunk_id, i) for i in range(parts)))
        pipe.hincrby(self.keys.ingest, "queued_bytes", -size)


def _encode(data: LabeledData) -> bytes:
    return safetensors.torch.save({"x": data.x.contiguous(), "y": data.y.contiguous()})


def _decode(blob: bytes) -> LabeledData:
    tensors = safetensors.torch.load(blob)
    return LabeledData(tensors["x"], tensors["y"])


class RedisBuffer:
    """A ``ChunkBuffer`` whose chunks live in Redis; membership changes are saved at commit."""

    def __init__(self, client: Any, keys: StreamKeys):
        self.client = client
        self.keys = keys
        self._pending = [int(m) for m in client.zrange(keys.pending, 0, -1)]
        self._kept = [int(m) for m in client.zrange(keys.kept, 0, -1)]
        self._examples = {c: int(client.hget(keys.split(c), "examples") or 0) for c in self._pending + self._kept}
        self._dropped: list[int] = []

    def add(self, chunk: SplitChunk) -> None:
        if chunk.index in self._examples:
            raise ValueError(f"chunk {chunk.index} buffered twice")
        examples = len(chunk.train) + len(chunk.val)
        self.client.hset(
            self.keys.split(chunk.index),
            mapping={
                "train": _encode(chunk.train),
                "val": _encode(chunk.val),
                "examples": examples,
            },
        )
        self._pending.append(chunk.index)
        self._examples[chunk.index] = examples

    def pending_chunks(self) -> list[int]:
        return list(self._pending)

    def pending_examples(self) -> int:
        return sum(self._examples[c] for c in self._pending)

    def kept_chunks(self) -> list[int]:
        return list(self._kept)

    def training_data(self, replay: bool) -> tuple[LabeledData, LabeledData]:
        ids = sorted(self._pending + self._kept) if replay else self._pending
        if not ids:
            raise ValueError("no chunk to train on")
        splits = [self.split(chunk_id) for chunk_id in ids]
        return LabeledData.concat([s.train for s in splits]), LabeledData.concat([s.val for s in splits])

    def split(self, chunk_id: int) -> SplitChunk:
        """The buffered chunk ``chunk_id`` as the engine split it."""
        train, val = self.client.hmget(self.keys.split(chunk_id), ["train", "val"])
        if train is None or val is None:
            raise RuntimeError(f"buffered chunk {chunk_id} is missing from Redis ({self.keys.split(chunk_id)})")
        return SplitChunk(chunk_id, _decode(train), _decode(val))

    def mark_trained(self, replay: bool) -> None:
        if replay:
            self._kept.extend(self._pending)
        else:
            self._dropped.extend(self._pending)
            for chunk_id in self._pending:
                del self._examples[chunk_id]
        self._pending = []

    def stage_commit(self, pipe: Any) -> None:
        """Add the membership changes since the last commit to ``pipe`` (a MULTI/EXEC pipeline)."""
        for key, ids in ((self.keys.pending, self._pending), (self.keys.kept, self._kept)):
            pipe.delete(key)
            if ids:
                pipe.zadd(key, {c: c for c in ids})
        if self._dropped:
            pipe.delete(*(self.keys.split(c) for c in self._dropped))

    def committed(self) -> None:
        """The staged transaction ran: trained chunks deleted from Redis are forgotten."""
        self._dropped = []
