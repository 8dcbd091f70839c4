"""The ALMA stream: a dataset replayed as B mega-batches (paper section 5).

The training set is randomly partitioned (seeded) into B mega-batches of equal size; each
mega-batch arrives as a :class:`Chunk`. The engine later holds out ``val_fraction`` of each chunk
as that chunk's validation set (:func:`split_chunk`), so a chunk from Kafka and a chunk from this
simulator go through the same code.

A stream may drift (``stream.drift``, :class:`Drift`): from chunk ``at`` on (ramping over ``over``
chunks when gradual), every chunk and the test set are transformed alike, so the test error keeps measuring the distribution the chunks now
come from. The data sources (``alma simulate``, ``alma replay``) drift the chunks; the engine drifts
the test set it evaluates on after each chunk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from alma_daemon.config import ConfigError, DriftConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.task_terms import drift_misfit
from alma_daemon.data.tensors import LabeledData
from alma_daemon.seeding import derive_seed, generator

#: A chunk's time in its history (:attr:`Chunk.time`): ISO 8601 text, or a number as the history writes it.
ChunkTime = str | float


@dataclass(frozen=True)
class Chunk:
    """One mega-batch as it arrives: a monotone id (1-based), its labeled examples and, for a history
    with a time column, its time there."""

    index: int
    data: LabeledData
    #: The time of the chunk's newest row in the history it replays (``dataset.time_column`` of a
    #: table): ISO 8601 text in UTC where the times are date-times, the number as written where they
    #: are numbers. None for a stream without a time of its own (images, text, River, the wire's).
    time: ChunkTime | None = None

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


def ordered_stream(
    data: LabeledData,
    megabatches: int,
    limit: int | None = None,
    time_of: Callable[[int, int], ChunkTime | None] | None = None,
) -> Iterator[Chunk]:
    """``data`` (its first ``limit`` examples) in its own order as ``megabatches`` contiguous equal
    chunks, ids 1..B (the remainder is dropped): a stream whose order matters, as a drifting one's does.
    ``time_of(start, end)``: the time of the chunk of rows ``start`` to ``end - 1`` (:attr:`Chunk.time`)."""
    count = len(data) if limit is None else min(limit, len(data))
    size = count // megabatches
    if size == 0:
        raise ValueError(f"{count} examples cannot make {megabatches} non-empty mega-batches")
    for index in range(megabatches):
        start, end = index * size, (index + 1) * size
        time = time_of(start, end) if time_of is not None else None
        yield Chunk(index + 1, data.subset(torch.arange(start, end)), time)


def split_chunk(chunk: Chunk, val_fraction: float, seed: int) -> SplitChunk:
    """Hold out ``val_fraction`` of the chunk as its validation set: at least one example, and at least
    one left to train on (a one-example chunk has none held out; its stage then trains every epoch).

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


# -- drift ----------------------------------------------------------------------------------------
#: A drift kind's change: (examples, amount in (0, 1] of the full drift, key of this draw) -> changed examples.
#: The key seeds what is drawn at random (a chunk's id; 0 for the test set), so a replay draws alike.
Apply = Callable[[LabeledData, float, int], LabeledData]
#: The key the test set's random draws are seeded with (chunk ids start at 1).
TEST_SET_KEY = 0


@dataclass(frozen=True)
class Drift:
    """A change of distribution: from chunk ``at`` on, chunks and test set go through ``apply``, at an
    amount that ramps linearly from 1/``over`` at chunk ``at`` to the full drift at chunk ``at + over - 1``
    (``over`` = 1: abrupt)."""

    at: int
    apply: Apply
    description: str
    over: int = 1

    def applies_to(self, chunk_index: int) -> bool:
        return chunk_index >= self.at

    def amount(self, chunk_index: int) -> float:
        """The share of the full drift at chunk ``chunk_index``: 0 before ``at``, 1 from ``at + over - 1`` on."""
        if not self.applies_to(chunk_index):
            return 0.0
        return min(1.0, (chunk_index - self.at + 1) / self.over)

    def chunk(self, chunk: Chunk) -> Chunk:
        """``chunk`` as the drifted stream delivers it."""
        if not self.applies_to(chunk.index):
            return chunk
        return dataclasses.replace(chunk, data=self.apply(chunk.data, self.amount(chunk.index), chunk.index))

    def test_set(self, data: LabeledData, chunk_index: int) -> LabeledData:
        """The test set as drifted as chunk ``chunk_index`` is (unchanged before ``at``)."""
        if not self.applies_to(chunk_index):
            return data
        return self.apply(data, self.amount(chunk_index), TEST_SET_KEY)


@dataclass(frozen=True)
class DriftKind:
    """A ``stream.drift.kind``: a factory of (apply, description) from the drift config, the task and the
    stream seed, and whether it can ramp over several chunks (``stream.drift.over``)."""

    build: Callable[[DriftConfig, TaskInfo, int], tuple[Apply, str]]
    gradual: bool


def build_drift(config: DriftConfig, task: TaskInfo, seed: int) -> Drift | None:
    """The drift ``stream.drift`` asks for on a stream of ``task`` (None for ``kind: none``)."""
    if config.kind == "none":
        return None
    misfit = drift_misfit(config.kind, task)
    if misfit is not None:
        raise ConfigError(misfit)
    assert config.at is not None  # DriftConfig requires it for every kind but none
    kind = DRIFT_KINDS[config.kind]
    if config.over > 1 and not kind.gradual:
        raise ConfigError(f"stream.drift.over: {config.kind} is abrupt only; set over: 1 or a gradual kind")
    apply, description = kind.build(config, task, seed)
    ramp = f" to chunk {config.at + config.over - 1}, linearly" if config.over > 1 else ""
    return Drift(config.at, apply, f"{description} from chunk {config.at}{ramp}", config.over)


def drifted(chunks: Iterable[Chunk], drift: Drift | None) -> Iterator[Chunk]:
    """The chunks of a stream as ``drift`` changes them."""
    for chunk in chunks:
        yield chunk if drift is None else drift.chunk(chunk)


def label_permutation(num_classes: int, seed: int) -> torch.Tensor:
    """A seeded permutation of the classes that moves every class (a derangement), so no label survives."""
    gen = generator(seed, "drift", "permute_labels")
    while True:
        permutation = torch.randperm(num_classes, generator=gen)
        if num_classes < 2 or not bool((permutation == torch.arange(num_classes)).any()):
            return permutation


def _permute_labels(config: DriftConfig, task: TaskInfo, seed: int) -> tuple[Apply, str]:
    permutation = label_permutation(task.num_classes, seed)

    def apply(data: LabeledData, amount: float, key: int) -> LabeledData:
        return LabeledData(data.x, permutation[data.y])

    return apply, f"labels permuted {permutation.tolist()}"


def _rotate(config: DriftConfig, task: TaskInfo, seed: int) -> tuple[Apply, str]:
    degrees = config.degrees

    def apply(data: LabeledData, amount: float, key: int) -> LabeledData:
        return LabeledData(rotate_images(data.x, degrees * amount, task.channels_last), data.y)

    return apply, f"images rotated by {degrees:g} degrees"


def shifted_classes(num_classes: int, seed: int) -> torch.Tensor:
    """The seeded half of the classes (at least one) that a prior shift makes rarer, sorted."""
    order = torch.randperm(num_classes, generator=generator(seed, "drift", "prior_shift"))
    return order[: max(1, num_classes // 2)].sort().values


def _prior_shift(config: DriftConfig, task: TaskInfo, seed: int) -> tuple[Apply, str]:
    rarer = shifted_classes(task.num_classes, seed)
    strength = config.strength

    def apply(data: LabeledData, amount: float, key: int) -> LabeledData:
        # Resampled with replacement, each example weighted by its class's new prior over its old,
        # so the examples keep their number and the classes their look.
        weights = torch.ones(task.num_classes)
        weights[rarer] = 1 - strength * amount
        draw = torch.multinomial(
            weights[data.y.long()], len(data), replacement=True, generator=generator(seed, "drift", "prior_shift", key)
        )
        return data.subset(draw)

    classes = rarer.tolist()
    return apply, f"classes {classes} {100 * strength:g} % rarer"


def rotate_images(x: torch.Tensor, degrees: float, channels_last: bool = False) -> torch.Tensor:
    """Rotate a batch of images (N x H x W, N x C x H x W or N x H x W x C) counter-clockwise about
    their centre, keeping dtype and shape; corners that come from outside the image are zero.

    Multiples of 90 degrees are exact (``torch.rot90``); other angles are bilinearly interpolated.
    """
    images = x.unsqueeze(1) if x.dim() == 3 else (x.permute(0, 3, 1, 2) if channels_last else x)
    quarter_turns = degrees / 90
    if quarter_turns == round(quarter_turns):
        rotated = torch.rot90(images, int(round(quarter_turns)) % 4, dims=(2, 3))
    else:
        theta = math.radians(degrees)
        # affine_grid maps output to input coordinates, so the matrix is the inverse (clockwise) rotation.
        matrix = torch.tensor([[math.cos(theta), -math.sin(theta), 0.0], [math.sin(theta), math.cos(theta), 0.0]])
        grid = F.affine_grid(matrix.expand(len(images), 2, 3), list(images.shape), align_corners=False)
        rotated = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        if not images.dtype.is_floating_point:
            info = torch.iinfo(images.dtype)
            rotated = rotated.round().clamp(info.min, info.max)
        rotated = rotated.to(images.dtype)
    if x.dim() == 3:
        return rotated.squeeze(1)
    return rotated.permute(0, 2, 3, 1).contiguous() if channels_last else rotated


#: ``stream.drift.kind`` -> how it changes the examples.
DRIFT_KINDS: dict[str, DriftKind] = {
    "permute_labels": DriftKind(_permute_labels, gradual=False),
    "rotate": DriftKind(_rotate, gradual=True),
    "prior_shift": DriftKind(_prior_shift, gradual=True),
}
