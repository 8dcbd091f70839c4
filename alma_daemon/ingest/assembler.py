"""Which parts to store: the bookkeeping that turns validated parts into complete chunks.

Pure logic, no Redis. The :class:`Assembler` holds the chunks being assembled (loaded from Redis
on start) and, for each validated part, answers *store* (new part, maybe completing its chunk) or
*duplicate* (a re-sent part: a no-op apart from moving the offset on). Parts that contradict the
chunk's other parts, or come after a newer chunk was completed, raise ``RejectedRecord``.
"""

from __future__ import annotations

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

    @property
    def complete(self) -> bool:
        return len(self.got) == self.parts


@dataclass(frozen=True)
class PartOutcome:
    """What to do with one valid part: store it (``duplicate`` False) or only move the offset on.

    ``completed`` is the chunk's progress when this part completed it; ``abandoned`` lists older
    chunks that can never complete now (the order guard will reject their remaining parts).
    """

    duplicate: bool
    completed: ChunkProgress | None = None
    abandoned: dict[int, ChunkProgress] = field(default_factory=dict)


def part_dtype(part: DecodedPart) -> str:
    """The dtype every part of a chunk must share: ``x``'s, or the tokens'."""
    tensor = part.x if part.x is not None else part.tokens
    assert tensor is not None
    return str(tensor.dtype).removeprefix("torch.")


class Assembler:
    """Tracks the chunks of one stream between their first part and their completion."""

    def __init__(
        self, stream: str, in_progress: dict[int, ChunkProgress] | None = None, last_completed: int | None = None
    ):
        self.stream = stream
        self.in_progress: dict[int, ChunkProgress] = dict(in_progress or {})
        self.guard = ChunkOrderGuard({stream: last_completed} if last_completed is not None else None)

    @property
    def last_completed(self) -> int | None:
        return self.guard.last_completed(self.stream)

    def accept(self, part: DecodedPart, size: int) -> PartOutcome:
        """Account for one validated part of ``size`` bytes; raises ``RejectedRecord`` if it does not fit."""
        self.guard.check(part.stream, part.chunk_id)
        if part.chunk_id == self.last_completed:
            return PartOutcome(duplicate=True)
        dtype = part_dtype(part)
        progress = self.in_progress.get(part.chunk_id)
        if progress is None:
            progress = ChunkProgress(parts=part.parts, dtype=dtype)
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
            return PartOutcome(duplicate=True)
        progress.got.add(part.part)
        progress.examples += part.examples
        progress.bytes += size
        self.in_progress[part.chunk_id] = progress
        if not progress.complete:
            return PartOutcome(duplicate=False)
        del self.in_progress[part.chunk_id]
        self.guard.complete(part.stream, part.chunk_id)
        abandoned = {c: p for c, p in self.in_progress.items() if c < part.chunk_id}
        for chunk_id in abandoned:
            del self.in_progress[chunk_id]
        return PartOutcome(duplicate=False, completed=progress, abandoned=abandoned)
