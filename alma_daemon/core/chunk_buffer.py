"""Where chunks wait between arrival and training.

The engine talks to a :class:`ChunkBuffer`; the simulator uses :class:`MemoryBuffer`, the daemon a
Redis-backed buffer with the same methods. Without replay, trained chunks are dropped; with replay
every chunk is kept and each stage trains on all of them (Algorithm 1, lines 5-8).
"""

from __future__ import annotations

from typing import Protocol

from alma_daemon.data.streams import SplitChunk
from alma_daemon.data.tensors import LabeledData


class ChunkBuffer(Protocol):
    """Chunks received and not yet discarded, split into train and validation parts."""

    def add(self, chunk: SplitChunk) -> None: ...

    def pending_chunks(self) -> list[int]:
        """Ids of chunks not yet trained on, in arrival order."""
        ...

    def pending_examples(self) -> int: ...

    def training_data(self, replay: bool) -> tuple[LabeledData, LabeledData]:
        """(train, val) of the next stage: the pending chunks, or every kept chunk with replay."""
        ...

    def mark_trained(self, replay: bool) -> None:
        """The pending chunks have been trained on; without replay they are deleted."""
        ...


class MemoryBuffer:
    """An in-process :class:`ChunkBuffer` for simulations."""

    def __init__(self) -> None:
        self._chunks: dict[int, SplitChunk] = {}
        self._pending: list[int] = []

    def add(self, chunk: SplitChunk) -> None:
        if chunk.index in self._chunks:
            raise ValueError(f"chunk {chunk.index} buffered twice")
        self._chunks[chunk.index] = chunk
        self._pending.append(chunk.index)

    def pending_chunks(self) -> list[int]:
        return list(self._pending)

    def pending_examples(self) -> int:
        return sum(len(self._chunks[i].train) + len(self._chunks[i].val) for i in self._pending)

    def training_data(self, replay: bool) -> tuple[LabeledData, LabeledData]:
        ids = sorted(self._chunks) if replay else self._pending
        if not ids:
            raise ValueError("no chunk to train on")
        chunks = [self._chunks[i] for i in ids]
        return LabeledData.concat([c.train for c in chunks]), LabeledData.concat([c.val for c in chunks])

    def mark_trained(self, replay: bool) -> None:
        if not replay:
            for i in self._pending:
                del self._chunks[i]
        self._pending = []
