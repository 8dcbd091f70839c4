"""Bounded, class-stratified samples of a stream's examples that persist across stages.

A team's chunks are small and imbalanced: a stage's own 10 % validation slice holds a couple of frauds,
and a fraud seen in March is gone from a stage in June. An :class:`ExampleReservoir` keeps, of every
example offered to it, those of lowest *rank*, up to a quota per class. A rank is a seeded draw per
chunk (the same for (seed, purpose, chunk) in every front door and after a restart), weighted towards
recent chunks: Efraimidis and Spirakis' weighted reservoir with a weight that doubles every
``half_life`` chunks, kept as ``log(E) - chunk * ln 2 / half_life`` for an exponential draw E, so the
reservoir samples the stream with examples counting half as much every ``half_life`` chunks (uniformly
without a half-life). On a moving stream a uniform sample is mostly of what no longer holds: validated
on it, a stage stops before it learns the new rule. The quotas:

:func:`proportional_quotas`: the stream's class mix, each class holding at least ``floor`` examples where
the stream has had them (the guard's minimum of positives), so that a rare class's examples stay while
its quota has room: a fraud seen in March still teaches in June, unless newer frauds took its place.
(A class-balanced replay set was tried and dropped: with the class weights a team sets, it made every
old fraud count for dozens of new ones, and on a history whose fraud rule changed it taught the old rule.)

A regression's examples form one stratum. The reservoir counts the examples of each class it was
offered (``seen``), so a sample whose mix differs from the stream's can be weighted back to it
(:meth:`ExampleReservoir.stream_weights`). Its tensors are what a checkpoint saves (:meth:`tensors`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from alma_daemon.data.streams import SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.seeding import generator

#: (examples of each stratum seen, capacity) -> the examples each stratum keeps at most.
Quotas = Callable[[Sequence[int], int], list[int]]


def proportional_quotas(floor: int) -> Quotas:
    """Each class's share of the stream, at least ``floor`` (or all it has had), the largest class giving way."""

    def quotas(seen: Sequence[int], capacity: int) -> list[int]:
        total = sum(seen)
        if total <= capacity:
            return list(seen)
        wanted = [min(n, max(floor, round(capacity * n / total))) for n in seen]
        largest = max(range(len(seen)), key=lambda c: seen[c])
        wanted[largest] = max(0, capacity - sum(w for c, w in enumerate(wanted) if c != largest))
        return wanted

    return quotas


def log_ranks(count: int, draw: torch.Generator, chunk: int, half_life: float | None) -> torch.Tensor:
    """``count`` log-ranks of chunk ``chunk``'s examples (module docstring)."""
    exponential = -torch.log1p(-torch.rand(count, generator=draw, dtype=torch.float64))
    logs = exponential.clamp_min(1e-300).log()
    return logs if half_life is None else logs - chunk * math.log(2) / half_life


@dataclass(frozen=True)
class ExampleReservoir:
    """Examples kept of a stream (``data``), each with its rank, and the examples of each stratum seen."""

    data: LabeledData
    #: Each example's log-rank (module docstring): within a stratum, the lowest stay.
    ranks: torch.Tensor
    #: The examples of each stratum (class; one for a regression) offered so far.
    seen: tuple[int, ...]

    @classmethod
    def empty(cls, like: LabeledData, strata: int) -> ExampleReservoir:
        return cls(like.subset(slice(0, 0)), torch.empty(0, dtype=torch.float64), (0,) * strata)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> ExampleReservoir:
        """The reservoir :meth:`tensors` saved."""
        return cls(LabeledData(tensors["x"], tensors["y"]), tensors["ranks"], tuple(tensors["seen"].tolist()))

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint saves: ``x`` and ``y`` (what the guard reads), ``ranks`` and ``seen``."""
        return {
            "x": self.data.x.contiguous().cpu(),
            "y": self.data.y.contiguous().cpu(),
            "ranks": self.ranks.contiguous().cpu(),
            "seen": torch.tensor(self.seen, dtype=torch.int64),
        }

    def __len__(self) -> int:
        return len(self.data)

    def strata(self, y: torch.Tensor) -> torch.Tensor:
        """Each label's stratum: its class, or 0 for a regression's targets."""
        if len(self.seen) == 1 or y.is_floating_point():
            return torch.zeros(len(y), dtype=torch.long)
        return y.long()

    def offered(
        self,
        parts: Sequence[tuple[int, LabeledData]],
        seed: int,
        purpose: str,
        capacity: int,
        quotas: Quotas,
        half_life: float | None = None,
    ) -> ExampleReservoir:
        """This reservoir with ``parts`` ((chunk id, examples) pairs) offered: each stratum keeps its
        ``quotas`` of ``capacity`` of lowest rank, the old and new examples alike."""
        parts = [(chunk, data) for chunk, data in parts if len(data)]
        if not parts:
            return self
        ranks = [log_ranks(len(data), generator(seed, purpose, chunk), chunk, half_life) for chunk, data in parts]
        data = LabeledData.concat([self.data, *(d for _, d in parts)])
        rank = torch.cat([self.ranks, *ranks])
        stratum = self.strata(data.y)
        seen = list(self.seen)
        for _, part in parts:
            counts = torch.bincount(self.strata(part.y), minlength=len(seen))
            seen = [s + int(n) for s, n in zip(seen, counts.tolist(), strict=False)]
        keep = []
        for s, quota in enumerate(quotas(seen, capacity)):
            members = (stratum == s).nonzero().flatten()
            keep.append(members[rank[members].argsort(stable=True)[:quota]])
        kept = torch.cat(keep).sort().values
        # Ascending rank: a prefix of the reservoir is itself a sample (the guard's probe reads one).
        order = kept[rank[kept].argsort(stable=True)]
        return ExampleReservoir(data.subset(order), rank[order], tuple(seen))

    def offered_splits(
        self,
        splits: Sequence[SplitChunk],
        part: str,
        seed: int,
        capacity: int,
        quotas: Quotas,
        half_life: float | None = None,
    ) -> ExampleReservoir:
        """:meth:`offered` with the ``part`` (``train`` or ``val``) of each split chunk."""
        parts = [(s.index, getattr(s, part)) for s in splits]
        return self.offered(parts, seed, f"reservoir {part}", capacity, quotas, half_life)

    def sample(self, count: int, quotas: Quotas) -> LabeledData:
        """``count`` of the examples held, each stratum its ``quotas`` of them, of lowest rank."""
        if count >= len(self):
            return self.data
        stratum = self.strata(self.data.y)
        held = torch.bincount(stratum, minlength=len(self.seen)).tolist()
        # The examples are in ascending rank: a stratum's first ones are its lowest.
        picks = [(stratum == s).nonzero().flatten()[:quota] for s, quota in enumerate(quotas(held, count))]
        return self.data.subset(torch.cat(picks).sort().values)

    def stream_weights(self, y: torch.Tensor) -> torch.Tensor:
        """A weight for each label of ``y`` (a sample of this reservoir) that makes the sample's class mix
        the stream's: (the stratum's share of the stream) / (its share of ``y``)."""
        stratum = self.strata(y)
        held = torch.bincount(stratum, minlength=len(self.seen)).double()
        seen = torch.tensor(self.seen, dtype=torch.float64)
        share = held / max(1.0, float(held.sum()))
        ratio = torch.where(held > 0, (seen / max(1.0, float(seen.sum()))) / share, torch.zeros_like(held))
        return ratio[stratum]
