"""Which ready chunk the engine takes next: chunk-id order, a bounded wait for a missing id, late chunks.

A topic's partitions are read in no fixed order, so chunk 7 may complete before chunk 6. The engine
takes chunks in id order; when the next id is missing and a later chunk is ready, the
:class:`ReorderGate` holds the later chunk back for at most ``daemon.reorder_wait_seconds`` (the
missing chunk may be on a partition read a moment later), then lets it go: a gap that never fills
never stalls the stream. A chunk that completes after a later one was taken is *late*: it is taken
at once, as the next step, and recorded as such (``StepRecord.late``).

Pure logic (no Redis, the clock passed in): the daemon asks it once per turn of its main loop. The
wait is kept in memory only; a restarted daemon waits afresh, at most once more per gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NextChunk:
    """The gate's answer: the chunk to take now (None: none), and what is held back."""

    take: int | None = None
    #: ``take`` completed after a later chunk was taken.
    late: bool = False
    #: The missing id the ready chunks wait for, and how many ready chunks wait behind it.
    missing: int | None = None
    waiting: int = 0
    #: Seconds until the wait for ``missing`` ends (then the lowest ready chunk is taken).
    wait_left: float | None = None


class ReorderGate:
    """Holds ready chunks back behind a missing chunk id for at most ``wait_seconds``."""

    def __init__(self, wait_seconds: float):
        self.wait_seconds = wait_seconds
        #: The missing id waited for, and since when (the caller's clock).
        self._gap: tuple[int, float] | None = None

    def choose(self, ready: Sequence[int], last_taken: int, lowest_assembling: int | None, now: float) -> NextChunk:
        """The chunk to take among ``ready`` (ascending ids), after ``last_taken`` (0: none yet).

        ``lowest_assembling`` is the lowest id with parts stored but not complete: before the first
        chunk it is the only sign of a missing id, since a stream's ids may start anywhere.
        """
        if not ready:
            self._gap = None
            return NextChunk()
        lowest = ready[0]
        if last_taken and lowest < last_taken:
            self._gap = None
            return NextChunk(take=lowest, late=True)
        missing = self._missing(lowest, last_taken, lowest_assembling)
        if missing is None:
            self._gap = None
            return NextChunk(take=lowest)
        if self._gap is None or self._gap[0] != missing:
            self._gap = (missing, now)
        left = self._gap[1] + self.wait_seconds - now
        if left <= 0:
            self._gap = None
            return NextChunk(take=lowest)
        return NextChunk(missing=missing, waiting=len(ready), wait_left=left)

    @staticmethod
    def _missing(lowest: int, last_taken: int, lowest_assembling: int | None) -> int | None:
        if last_taken:
            return None if lowest == last_taken + 1 else last_taken + 1
        if lowest_assembling is not None and lowest_assembling < lowest:
            return lowest_assembling
        return None
