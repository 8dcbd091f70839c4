"""The Redis buffer: complete chunks waiting for the engine, and the engine's ChunkBuffer.

:class:`ReadyChunks` is where ingest leaves complete chunks (``alma:{s}:ready`` plus their parts);
the daemon takes them in id order. :class:`RedisBuffer` implements the ``ChunkBuffer`` protocol of
``chunk_buffer.py`` so the engine uses it exactly as the simulator's ``MemoryBuffer``. Redis holds only
the hot set: the chunks being assembled or ready, and the ids and sizes of the chunks the engine took;
their examples are in the chunk store (``chunk_store.py``).

Crash safety: the engine's changes to the buffer (a chunk added, chunks marked trained) are kept in
memory until :meth:`RedisBuffer.stage_commit` adds them to the daemon's one MULTI/EXEC that also
removes the chunk from ``ready`` and saves the engine state. A run killed before that transaction
restarts from the previous step as if the interrupted one never happened. The chunk's file is
written eagerly: it is a pure function of the chunk, so rewriting it when the step is redone is
harmless, and the start-up sweep deletes it if the step never commits.
"""

from __future__ import annotations

from typing import Any

import safetensors.torch

from alma_daemon.config import ConfigError
from alma_daemon.config.masking import mask_url
from alma_daemon.core.chunk_buffer import StageData, chunk_examples, stage_data
from alma_daemon.core.stage_plan import StageChoice, StagePlan
from alma_daemon.data.datasets import DatasetError
from alma_daemon.data.streams import Chunk, SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import sequences
from alma_daemon.data.wire import DecodedPart, RejectedRecord, assemble_chunk
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.chunk_store import ChunkStore


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


class RedisBuffer:
    """A ``ChunkBuffer`` whose chunks' ids and sizes live in Redis and their examples in a
    :class:`ChunkStore`; membership changes are saved at commit.

    The files of the chunks a stage drops are deleted once the next stage commits, not at once: Redis
    with ``appendfsync everysec`` can lose its last commit, and the daemon then redoes that stage on
    the chunks it held before (more than one lost stage is refused at start-up: ``bootstrap.py``).
    """

    def __init__(self, client: Any, keys: StreamKeys, store: ChunkStore):
        self.client = client
        self.keys = keys
        self.store = store
        self._pending = [int(m) for m in client.zrange(keys.pending, 0, -1)]
        self._kept = [int(m) for m in client.zrange(keys.kept, 0, -1)]
        named = self._pending + self._kept
        sizes = client.hmget(keys.buffered, named) if named else []
        self._examples = {c: int(size or 0) for c, size in zip(named, sizes, strict=True)}
        #: Chunks forgotten since the last commit, and those of the last committed stage (see above).
        self._dropped: list[int] = []
        self._dropped_by_last_stage: list[int] = []
        self._stage_since_commit = False

    @classmethod
    def open(cls, client: Any, keys: StreamKeys, store: ChunkStore) -> RedisBuffer:
        """The buffer as the last commit left it, at start-up or reload: the store checked writable and
        swept of the files no committed step names; a chunk Redis names must be in it."""
        store.check_writable()
        buffer = cls(client, keys, store)
        named = set(buffer._examples)
        missing = sorted(named - store.sweep(named))
        if missing:
            raise ConfigError(
                f"redis.chunk_store: {mask_url(store.url)} lacks {len(missing)} chunks that Redis buffers "
                f"({keys.pending}, {keys.kept}), e.g. {missing[:5]}: point it at the store this stream was "
                "started with"
            )
        return buffer

    def add(self, chunk: SplitChunk) -> None:
        if chunk.index in self._examples:
            raise ValueError(f"chunk {chunk.index} buffered twice")
        self.store.write(chunk)
        self._pending.append(chunk.index)
        self._examples[chunk.index] = chunk_examples(chunk)

    def pending_chunks(self) -> list[int]:
        return list(self._pending)

    def pending_examples(self) -> int:
        return sum(self._examples[c] for c in self._pending)

    def kept_chunks(self) -> list[int]:
        return list(self._kept)

    def kept_examples(self) -> int:
        return sum(self._examples[c] for c in self._kept)

    def training_data(self, plan: StagePlan, stage: int) -> StageData:
        return stage_data(plan, stage, self._pending, self._kept, self._examples, self.split)

    def split(self, chunk_id: int) -> SplitChunk:
        """The buffered chunk ``chunk_id`` as the engine split it."""
        return self.store.read(chunk_id)

    def mark_trained(self, plan: StagePlan, choice: StageChoice) -> None:
        kept, forgotten = plan.after_stage(self._pending, self._kept, choice.trained, self._examples)
        for chunk_id in forgotten:
            del self._examples[chunk_id]
        self._dropped.extend(forgotten)
        self._kept, self._pending = list(kept), []
        self._stage_since_commit = True

    def stage_commit(self, pipe: Any) -> None:
        """Add the membership changes since the last commit to ``pipe`` (a MULTI/EXEC pipeline)."""
        for key, ids in ((self.keys.pending, self._pending), (self.keys.kept, self._kept)):
            pipe.delete(key)
            if ids:
                pipe.zadd(key, {c: c for c in ids})
        pipe.delete(self.keys.buffered)
        if self._examples:
            pipe.hset(self.keys.buffered, mapping=self._examples)

    def committed(self) -> None:
        """The staged transaction ran. After a stage, the files the previous stage dropped are deleted
        (a chunk since buffered again keeps its file), and this stage's wait for the next."""
        if not self._stage_since_commit:
            return
        self.store.delete(c for c in self._dropped_by_last_stage if c not in self._examples)
        self._dropped_by_last_stage, self._dropped = self._dropped, []
        self._stage_since_commit = False
