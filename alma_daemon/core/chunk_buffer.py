"""Where chunks wait between arrival and training.

The engine talks to a :class:`ChunkBuffer`; the simulator uses :class:`MemoryBuffer`, the daemon a
Redis-backed buffer with the same methods. What a stage trains on and which chunks stay for replay
afterwards are the :class:`~alma_daemon.core.stage_plan.StagePlan`'s rules (Algorithm 1, lines 5-8,
bounded by ``stream.replay_keep`` and ``train.max_stage_examples``); both buffers apply them through
:func:`stage_data` and :meth:`StagePlan.after_stage`, so they hold and yield the same chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from alma_daemon.core.stage_plan import StageChoice, StagePlan
from alma_daemon.data.streams import SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.seeding import generator


@dataclass(frozen=True)
class StageData:
    """What a stage trains on: the examples joined, and the chunks chosen (:meth:`StagePlan.choose`)."""

    train: LabeledData
    val: LabeledData
    choice: StageChoice
    #: The pending chunks trained on, as split (and cut): what the example reservoirs are offered.
    fresh: tuple[SplitChunk, ...] = ()

    @property
    def trained(self) -> tuple[int, ...]:
        """The pending chunks trained on."""
        return self.choice.trained

    @property
    def dropped(self) -> tuple[int, ...]:
        """The pending chunks the stage cap dropped untrained."""
        return self.choice.dropped


class ChunkBuffer(Protocol):
    """Chunks received and not yet discarded, split into train and validation parts."""

    def add(self, chunk: SplitChunk) -> None: ...

    def pending_chunks(self) -> list[int]:
        """Ids of chunks not yet trained on, in arrival order."""
        ...

    def pending_examples(self) -> int: ...

    def kept_chunks(self) -> list[int]:
        """Ids of the trained chunks kept for replay, ascending."""
        ...

    def kept_examples(self) -> int: ...

    def training_data(self, plan: StagePlan, stage: int) -> StageData:
        """What stage ``stage`` trains on under ``plan``; raises ``ValueError`` when that is nothing."""
        ...

    def mark_trained(self, plan: StagePlan, choice: StageChoice) -> None:
        """The stage of ``choice`` trained: nothing is pending any more, the replay set is ``plan``'s,
        and the chunks no set holds are forgotten."""
        ...


def stage_data(
    plan: StagePlan,
    stage: int,
    pending: Sequence[int],
    kept: Sequence[int],
    examples: Mapping[int, int],
    load: Callable[[int], SplitChunk],
) -> StageData:
    """The chunks ``plan`` chooses for stage ``stage``, read with ``load`` and joined in id order."""
    choice = plan.choose(stage, pending, kept, examples)
    if not choice.chunks:
        raise ValueError("no chunk to train on")
    splits = [load(chunk_id) for chunk_id in choice.chunks]
    if choice.cut is not None:
        chunk_id, keep = choice.cut
        splits = [cut_split(s, keep, plan.seed, stage) if s.index == chunk_id else s for s in splits]
    fresh = tuple(s for s in splits if s.index in choice.trained)
    train, val = LabeledData.concat([s.train for s in splits]), LabeledData.concat([s.val for s in splits])
    return StageData(train, val, choice, fresh)


def cut_split(split: SplitChunk, examples: int, seed: int, stage: int) -> SplitChunk:
    """A seeded sample of ``examples`` of the chunk's examples, drawn from its training and validation
    parts in proportion (at least one to train on), the same for (seed, stage, chunk) in every buffer."""
    n_train, n_val = len(split.train), len(split.val)
    val = min(n_val, round(examples * n_val / (n_train + n_val)), examples - 1)
    draw = generator(seed, "stage cut", stage, split.index)
    train_index = torch.randperm(n_train, generator=draw)[: examples - val]
    val_index = torch.randperm(n_val, generator=draw)[:val]
    return SplitChunk(split.index, split.train.subset(train_index), split.val.subset(val_index))


def chunk_examples(chunk: SplitChunk) -> int:
    """A chunk's examples as the stage plan counts them: training and validation."""
    return len(chunk.train) + len(chunk.val)


class MemoryBuffer:
    """An in-process :class:`ChunkBuffer` for simulations."""

    def __init__(self) -> None:
        self._chunks: dict[int, SplitChunk] = {}
        self._pending: list[int] = []
        self._kept: list[int] = []

    @classmethod
    def holding(cls, kept: Sequence[SplitChunk], pending: Sequence[SplitChunk]) -> MemoryBuffer:
        """A buffer with ``kept`` chunks already trained and kept for replay, and ``pending`` ones."""
        buffer = cls()
        for chunk in [*kept, *pending]:
            buffer.add(chunk)
        buffer._pending = [c.index for c in pending]
        buffer._kept = sorted(c.index for c in kept)
        return buffer

    def add(self, chunk: SplitChunk) -> None:
        if chunk.index in self._chunks:
            raise ValueError(f"chunk {chunk.index} buffered twice")
        self._chunks[chunk.index] = chunk
        self._pending.append(chunk.index)

    def pending_chunks(self) -> list[int]:
        return list(self._pending)

    def pending_examples(self) -> int:
        return sum(chunk_examples(self._chunks[i]) for i in self._pending)

    def kept_chunks(self) -> list[int]:
        return list(self._kept)

    def kept_examples(self) -> int:
        return sum(chunk_examples(self._chunks[i]) for i in self._kept)

    def _examples(self) -> dict[int, int]:
        return {i: chunk_examples(chunk) for i, chunk in self._chunks.items()}

    def training_data(self, plan: StagePlan, stage: int) -> StageData:
        return stage_data(plan, stage, self._pending, self._kept, self._examples(), self._chunks.__getitem__)

    def mark_trained(self, plan: StagePlan, choice: StageChoice) -> None:
        kept, forgotten = plan.after_stage(self._pending, self._kept, choice.trained, self._examples())
        for chunk_id in forgotten:
            del self._chunks[chunk_id]
        self._kept, self._pending = list(kept), []
