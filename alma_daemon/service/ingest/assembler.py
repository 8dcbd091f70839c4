"""Which parts to store: the bookkeeping that turns validated parts into complete chunks.

Pure logic, no Redis. The :class:`Assembler` holds the chunks being assembled (loaded from Redis
on start) and, for each validated part, answers whether to store it (a new part, maybe completing
its chunk) or not (a re-sent part, a part of a chunk already completed, or one of a refused chunk: a
no-op apart from moving the offset on), and which incomplete chunks to give up. Chunks complete in
any order (a topic's partitions are read in no fixed order); parts that contradict the chunk's other
parts, or fall outside the order guard's window around the newest completed chunk, raise
``RejectedRecord``.

The parts of incomplete chunks are bounded (``max_bytes``, the config's ``redis.max_buffer_bytes``):
the engine cannot take them, so pausing ingest would not free them. A chunk that alone outgrows the
bound is refused: its stored parts are dropped and its later parts skipped until it falls behind
the order guard's window. It is refused as soon as one part shows that it cannot fit: the parts it
still lacks are taken to be as large as that part, but for one (producers cut a chunk into parts of
about one size, the last maybe smaller), so a part announcing an absurd count of parts is refused at
once, before it pushes other chunks out. Otherwise a
part that does not fit drops the other incomplete chunks, lowest id first, until it fits (a dropped
chunk's later parts start it again). A chunk still incomplete ``max_age`` seconds after its first
part arrived is given up the same way (:meth:`Assembler.expire`). Every choice but that one depends
only on state that the store saves with each batch (the chunks' stored parts and arrival times, the
newest completed chunk, the refused chunks, the completed ids in the window), so a restarted ingest
chooses as an uninterrupted one would; the expiry depends on the clock, and on the caller, which
asks only while it has read what the transport holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from alma_daemon.data.wire import ChunkOrderGuard, DecodedPart, RejectedRecord


@dataclass
class ChunkProgress:
    """The stored parts of one chunk that is not complete yet."""

    parts: int
    dtype: str
    got: set[int] = field(default_factory=set)
    examples: int = 0
    bytes: int = 0
    #: When its first part arrived (the assembler's clock; the chunk hash's ``arrived_at``).
    arrived_at: float = 0.0

    @property
    def complete(self) -> bool:
        return len(self.got) == self.parts


@dataclass(frozen=True)
class PartOutcome:
    """What to do with one valid part: store it, or only move the offset on (``store`` False: a
    re-sent part, or a part of a refused chunk).

    ``completed`` is the chunk's progress when this part completed it. ``dropped`` lists the
    incomplete chunks given up, in order, each with the reason to dead-letter it: first those
    dropped to keep within ``max_bytes`` (``size``), then, when the part completed its chunk, those
    that fell behind the order guard's window and can never complete now (``part_numbering``).
    A part whose own chunk cannot fit ``max_bytes`` drops that chunk (``size``), and is not stored.
    """

    store: bool
    completed: ChunkProgress | None = None
    dropped: dict[int, tuple[ChunkProgress, RejectedRecord]] = field(default_factory=dict)


def part_dtype(part: DecodedPart) -> str:
    """The dtype every part of a chunk must share: ``x``'s, or the tokens'."""
    tensor = part.x if part.x is not None else part.tokens
    assert tensor is not None
    return str(tensor.dtype).removeprefix("torch.")


class Assembler:
    """Tracks the chunks of one stream between their first part and their completion."""

    def __init__(
        self,
        stream: str,
        in_progress: dict[int, ChunkProgress] | None = None,
        completed: Iterable[int] = (),
        max_bytes: int | None = None,
        refused: Iterable[int] = (),
        max_ahead: int | None = None,
        max_age: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """``max_age``: seconds a chunk may stay incomplete after its first part (None: for ever);
        ``clock``: what stamps a chunk's first part, and what :meth:`expire` compares with."""
        self.stream = stream
        self.in_progress: dict[int, ChunkProgress] = dict(in_progress or {})
        #: ``max_ahead`` (the config's ``daemon.max_chunks_ahead``; None: no bound) is the guard's window:
        #: a part of a chunk that far from the newest completed one is rejected before it is stored.
        self.guard = ChunkOrderGuard({stream: completed}, max_ahead)
        #: Bound on the bytes of incomplete chunks (None: unbounded).
        self.max_bytes = max_bytes
        #: Bytes of the parts of incomplete chunks (the sum over ``in_progress``).
        self.bytes = sum(progress.bytes for progress in self.in_progress.values())
        #: Chunks refused as larger than ``max_bytes``, whose later parts are skipped; kept until they
        #: fall behind the order guard's window (it rejects their parts from then on). Each took more
        #: than ``max_bytes`` of input, so few can exist. Chunks given up as incomplete for ``max_age``
        #: join them, so their late parts do not start them again.
        self.refused: set[int] = set(refused)
        self.max_age = max_age
        self.clock = clock

    @property
    def last_completed(self) -> int | None:
        return self.guard.last_completed(self.stream)

    @property
    def window_floor(self) -> int | None:
        """The oldest chunk id whose parts the order guard still takes (None: no bound, or no chunk yet)."""
        newest = self.last_completed
        if newest is None or self.guard.max_ahead is None:
            return None
        return newest - self.guard.max_ahead + 1

    def accept(self, part: DecodedPart, size: int) -> PartOutcome:
        """Account for one validated part of ``size`` bytes; raises ``RejectedRecord`` if it does not fit."""
        self.guard.check(part.stream, part.chunk_id)
        if self.guard.is_completed(self.stream, part.chunk_id) or part.chunk_id in self.refused:
            return PartOutcome(store=False)
        dtype = part_dtype(part)
        progress = self.in_progress.get(part.chunk_id)
        if progress is None:
            progress = ChunkProgress(parts=part.parts, dtype=dtype, arrived_at=self.clock())
        elif part.parts != progress.parts:
            raise RejectedRecord(
                "part_numbering",
                f"part {part.part} of chunk {part.chunk_id} says {part.parts} "
                f"parts; earlier parts said {progress.parts}",
            )
        elif dtype != progress.dtype:
            raise RejectedRecord(
                "dtype", f"part {part.part} of chunk {part.chunk_id} is {dtype}; earlier parts are {progress.dtype}"
            )
        if part.part in progress.got:
            return PartOutcome(store=False)
        if self.max_bytes is not None and least_bytes(progress, size) > self.max_bytes:
            return self._refuse(part, progress, size, self.max_bytes)
        dropped = self._make_room(part.chunk_id, size)
        progress.got.add(part.part)
        progress.examples += part.examples
        progress.bytes += size
        self.bytes += size
        self.in_progress[part.chunk_id] = progress
        if not progress.complete:
            return PartOutcome(store=True, dropped=dropped)
        self._forget(part.chunk_id)
        self.guard.complete(part.stream, part.chunk_id)
        dropped |= self._abandon_behind_window(part.chunk_id)
        self.refused = {c for c in self.refused if not self.guard.behind_window(self.stream, c)}
        return PartOutcome(store=True, completed=progress, dropped=dropped)

    def _refuse(self, part: DecodedPart, progress: ChunkProgress, size: int, limit: int) -> PartOutcome:
        """Give up ``part``'s chunk, which outgrows ``limit``: drop its stored parts, skip its later ones."""
        if part.chunk_id in self.in_progress:
            self._forget(part.chunk_id)
        self.refused.add(part.chunk_id)
        detail = f"chunk {part.chunk_id} is larger than redis.max_buffer_bytes ({limit}): "
        if progress.bytes + size > limit:
            detail += f"{stored(progress)} were stored and part {part.part} adds {size}"
        else:
            lacking = progress.parts - len(progress.got) - 1
            detail += (
                f"it announces {progress.parts} parts and part {part.part} has {size} bytes; with {stored(progress)} "
                f"stored, the {lacking} parts it lacks, as large as this one but for the last, make at least "
                f"{least_bytes(progress, size)} bytes"
            )
        return PartOutcome(store=False, dropped={part.chunk_id: (progress, RejectedRecord("size", detail))})

    def expire(self) -> dict[int, tuple[ChunkProgress, RejectedRecord]]:
        """Give up the chunks still incomplete ``max_age`` seconds after their first part arrived:
        forgotten like a refused chunk (their later parts are skipped), each with its reason to
        dead-letter it (``incomplete``). Call it only once the parts the transport holds are read:
        a chunk's missing parts may wait unread behind a backlog (a daemon stopped for a while)."""
        if self.max_age is None:
            return {}
        now = self.clock()
        expired: dict[int, tuple[ChunkProgress, RejectedRecord]] = {}
        for chunk_id in sorted(c for c, p in self.in_progress.items() if now - p.arrived_at > self.max_age):
            progress = self._forget(chunk_id)
            self.refused.add(chunk_id)
            detail = (
                f"chunk {chunk_id} has {stored(progress)} {now - progress.arrived_at:.0f} s after its first part "
                f"arrived: daemon.incomplete_chunk_seconds allows {self.max_age:g} s; its later parts are skipped"
            )
            expired[chunk_id] = (progress, RejectedRecord("incomplete", detail))
        return expired

    def _make_room(self, chunk_id: int, size: int) -> dict[int, tuple[ChunkProgress, RejectedRecord]]:
        """Drop the incomplete chunks but ``chunk_id``, lowest id first, until ``size`` more bytes fit.

        Lowest first: chunks complete in id order, so the lowest are the ones a newer chunk's
        completion would abandon anyway.
        """
        dropped: dict[int, tuple[ChunkProgress, RejectedRecord]] = {}
        if self.max_bytes is None:
            return dropped
        while self.bytes + size > self.max_bytes:
            lowest = min(c for c in self.in_progress if c != chunk_id)
            progress = self._forget(lowest)
            detail = (
                f"chunk {lowest} dropped with {stored(progress)}: incomplete chunks may hold at most "
                f"redis.max_buffer_bytes ({self.max_bytes}) and a part of chunk {chunk_id} needed room"
            )
            dropped[lowest] = (progress, RejectedRecord("size", detail))
        return dropped

    def _abandon_behind_window(self, completed: int) -> dict[int, tuple[ChunkProgress, RejectedRecord]]:
        """Drop the incomplete chunks that ``completed``, which has just completed, moved behind the
        order guard's window: it will reject their missing parts."""
        abandoned: dict[int, tuple[ChunkProgress, RejectedRecord]] = {}
        for chunk_id in [c for c in self.in_progress if self.guard.behind_window(self.stream, c)]:
            progress = self._forget(chunk_id)
            detail = (
                f"chunk {chunk_id} has {len(progress.got)} of {progress.parts} parts and chunk {completed} completed, "
                f"{completed - chunk_id} ids later: daemon.max_chunks_ahead allows {self.guard.max_ahead} "
                f"(raise it if chunks arrive further out of order)"
            )
            abandoned[chunk_id] = (progress, RejectedRecord("part_numbering", detail))
        return abandoned

    def _forget(self, chunk_id: int) -> ChunkProgress:
        progress = self.in_progress.pop(chunk_id)
        self.bytes -= progress.bytes
        return progress


def stored(progress: ChunkProgress) -> str:
    return f"{len(progress.got)} of {progress.parts} parts ({progress.bytes} bytes)"


def least_bytes(progress: ChunkProgress, size: int) -> int:
    """The fewest bytes ``progress``'s chunk can take once a new part of ``size`` bytes is stored: the
    parts it still lacks taken to be as large as that one, but for one (the last part, often smaller)."""
    lacking = progress.parts - len(progress.got) - 1
    return progress.bytes + size + max(0, lacking - 1) * size
