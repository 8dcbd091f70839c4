"""Event streams: labeled events in, mega-batches out, cut every N examples and/or every T seconds.

A record of an event stream carries one labeled example or a few (``data/events.py``), no chunk
headers. The :class:`EventCutter` fills one *open chunk* at a time: each poll's valid examples are
appended to it as one more part (a safetensors blob of ``x`` float32 and ``y``), and the chunk is
cut, ready for the engine, once it holds ``stream.chunk_examples`` examples (the part that reaches
the count is split there, the rest opens the next chunk) or once its first example is
``stream.chunk_seconds`` old. Chunk ids run 1, 2, 3... without gaps.

The open chunk's state (:class:`OpenChunk`) is written in the same MULTI/EXEC as the parts and the
offsets (``store.py``), so a restarted daemon continues the same chunk from the same example and
cuts exactly the chunks an uninterrupted one would have cut from the same records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import safetensors.torch
import torch

from alma_daemon.data.events import decode_event
from alma_daemon.data.wire import RejectedRecord, StreamSchema
from alma_daemon.service.ingest.assembler import ChunkProgress
from alma_daemon.service.ingest.store import IngestBatch, Segment
from alma_daemon.transports.source import SourceRecord

#: Every event chunk holds float32 ``x``: JSON numbers are floats, and rows of uint8 pixels become
#: exact floats, so one chunk may mix both forms.
EVENT_DTYPE = "float32"


@dataclass
class OpenChunk:
    """The chunk being filled: its id, what it holds so far, and when its first example arrived."""

    chunk_id: int = 1
    examples: int = 0
    parts: int = 0
    bytes: int = 0
    opened_at: float | None = None

    def as_fields(self) -> dict[str, str]:
        """The state as ``alma:{s}:ingest`` fields."""
        fields = {"open_chunk": self.chunk_id, "open_examples": self.examples, "open_parts": self.parts}
        return {k: str(v) for k, v in fields.items()} | {
            "open_bytes": str(self.bytes),
            "open_since": "" if self.opened_at is None else f"{self.opened_at:.6f}",
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> OpenChunk:
        since = fields.get("open_since") or None
        return cls(
            chunk_id=int(fields.get("open_chunk", 1)),
            examples=int(fields.get("open_examples", 0)),
            parts=int(fields.get("open_parts", 0)),
            bytes=int(fields.get("open_bytes", 0)),
            opened_at=float(since) if since is not None else None,
        )


@dataclass
class EventCutter:
    """Cuts a stream of examples into chunks of ``chunk_examples`` and/or ``chunk_seconds``."""

    chunk_examples: int | None
    chunk_seconds: float | None
    open: OpenChunk = field(default_factory=OpenChunk)

    def __post_init__(self) -> None:
        if self.chunk_examples is None and self.chunk_seconds is None:
            raise ValueError("an event stream needs stream.chunk_examples or stream.chunk_seconds")

    def add(self, x: torch.Tensor, y: torch.Tensor, now: float, batch: IngestBatch) -> None:
        """Append the examples to the open chunk (as parts of ``batch``), cutting where the count is reached."""
        start = 0
        while start < len(y):
            if self.open.examples == 0:
                self.open.opened_at = now
            room = len(y) - start if self.chunk_examples is None else self.chunk_examples - self.open.examples
            end = start + min(room, len(y) - start)
            value = safetensors.torch.save({"x": x[start:end].contiguous(), "y": y[start:end].contiguous()})
            batch.segments.append(Segment(self.open.chunk_id, self.open.parts, value, end - start))
            self.open.parts += 1
            self.open.examples += end - start
            self.open.bytes += len(value)
            start = end
            if self.chunk_examples is not None and self.open.examples >= self.chunk_examples:
                self._cut(batch)

    def cut_if_due(self, now: float, batch: IngestBatch) -> None:
        """Cut the open chunk if its first example is ``chunk_seconds`` old."""
        opened = self.open.opened_at
        if self.chunk_seconds is not None and opened is not None and now - opened >= self.chunk_seconds:
            self._cut(batch)

    def _cut(self, batch: IngestBatch) -> None:
        done = self.open
        batch.completed[done.chunk_id] = ChunkProgress(
            parts=done.parts, dtype=EVENT_DTYPE, got=set(range(done.parts)), examples=done.examples, bytes=done.bytes
        )
        self.open = OpenChunk(chunk_id=done.chunk_id + 1)


@dataclass(frozen=True)
class EventStream:
    """How an event stream is cut (the config's ``stream.chunk_examples``, ``chunk_seconds``, ``features``)."""

    chunk_examples: int | None
    chunk_seconds: float | None
    features: tuple[str, ...] = ()

    def collector(self, schema: StreamSchema, ingest_fields: dict[str, str]) -> EventCollector:
        """A collector continuing the open chunk that ``ingest_fields`` (``alma:{s}:ingest``) record."""
        cutter = EventCutter(self.chunk_examples, self.chunk_seconds, OpenChunk.from_fields(ingest_fields))
        return EventCollector(cutter, schema, self.features)


class EventCollector:
    """Turns one poll of event records into an :class:`IngestBatch`: parts of the open chunk, the chunks
    cut, the events rejected, the offsets, and the open chunk's state after it."""

    def __init__(
        self,
        cutter: EventCutter,
        schema: StreamSchema,
        features: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
    ):
        self.cutter = cutter
        self.schema = schema
        self.features = tuple(features)
        self.clock = clock

    def collect(self, records: list[SourceRecord]) -> IngestBatch:
        batch = IngestBatch()
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        for record in records:
            batch.offsets[record.position] = record.next_offset
            try:
                if record.problem is not None:
                    raise RejectedRecord("headers", record.problem)
                x, y = decode_event(record.value, record.headers, self.schema, self.features)
            except RejectedRecord as rejection:
                batch.rejected.append((record, rejection))
                continue
            xs.append(x.to(torch.float32))
            ys.append(y)
        now = self.clock()
        if xs:
            self.cutter.add(torch.cat(xs), torch.cat(ys), now, batch)
        self.cutter.cut_if_due(now, batch)
        if batch.segments or batch.completed:
            batch.open_chunk = self.cutter.open.as_fields()
        return batch
