"""The ALMA stream: a dataset replayed as B mega-batches (paper section 5).

The training set is randomly partitioned (seeded) into B mega-batches of equal size; each
mega-batch arrives as a :class:`Chunk`. The engine later holds out ``val_fraction`` of each chunk
as that chunk's validation set (:func:`split_chunk`), so a chunk from Kafka and a chunk from this
simulator go through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from alma_daemon.data.tensors import LabeledData
from alma_daemon.seeding import derive_seed


@dataclass(frozen=True)
class Chunk:
    """One mega-batch as it arrives: a monotone id (1-based) and its labeled examples."""

    index: int
    data: LabeledData

    def __len__(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class SplitChunk:
    """A chunk after the engine held out its validation share."""

    index: int
    train: LabeledData
    val: LabeledData


def partition(data: LabeledData, megabatches: int, seed: int, limit: int | None = None) -> list[LabeledData]:
    """Randomly partition ``data`` into ``megabatches`` equal parts (the remainder is dropped)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "partition"))
    order = torch.randperm(len(data), generator=generator)
    if limit is not None:
        order = order[:limit]
    size = len(order) // megabatches
    if size == 0:
        raise ValueError(f"{len(order)} examples cannot make {megabatches} non-empty mega-batches")
    return [data.subset(order[i * size : (i + 1) * size]) for i in range(megabatches)]


def megabatch_stream(data: LabeledData, megabatches: int, seed: int, limit: int | None = None) -> Iterator[Chunk]:
    """Yield the stream's chunks in order, ids 1..B."""
    for index, part in enumerate(partition(data, megabatches, seed, limit), start=1):
        yield Chunk(index, part)


def split_chunk(chunk: Chunk, val_fraction: float, seed: int) -> SplitChunk:
    """Hold out ``val_fraction`` of the chunk (at least one example) as its validation set.

    The split depends only on (seed, chunk id), so every front door splits a chunk identically.
    """
    n = len(chunk)
    n_val = min(max(1, round(n * val_fraction)), n - 1) if n > 1 else 0
    generator = torch.Generator().manual_seed(derive_seed(seed, "split", chunk.index))
    order = torch.randperm(n, generator=generator)
    return SplitChunk(chunk.index, chunk.data.subset(order[n_val:]), chunk.data.subset(order[:n_val]))


def prequential_sample(chunk: Chunk, limit: int | None, seed: int) -> LabeledData:
    """The examples of ``chunk`` its prequential measure is taken on: all, or a seeded sample of ``limit``."""
    if limit is None or len(chunk) <= limit:
        return chunk.data
    generator = torch.Generator().manual_seed(derive_seed(seed, "prequential", chunk.index))
    return chunk.data.subset(torch.randperm(len(chunk), generator=generator)[:limit])
