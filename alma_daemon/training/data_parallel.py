"""One network trained data-parallel by the ranks torchrun started (DistributedDataParallel).

Where a learner trains one network (SM, UMix, gMoE, Firefly, the Switch LMs), :meth:`Trainer.fit`
spreads every mini-batch over the ranks. Every rank draws the same shuffled order (the stage's
generator is seeded alike everywhere) and takes its slice of each batch of ``train.batch_size``
examples, so the effective batch size stays ``train.batch_size``; DistributedDataParallel averages
the gradients (gloo on CPU, NCCL on GPU), and each rank's loss is scaled by its share of the batch,
so the averaged gradient is the whole batch's mean even where the slices differ by one example. The
validation set is split the same way and its measure combined over the ranks, so every rank reads
the same figure and early stopping decides the same everywhere. BatchNorm statistics follow rank 0
(DDP broadcasts them before every forward pass, and once more before validation), so all ranks keep
the same weights. Augmentation and dropout draw from generators of the rank's own, so ranks do not
repeat each other's masks. A report's FLOPs and seconds are summed over the ranks: the compute of
the whole stage.

Alone (no torchrun, or a learner that trains members one rank each, see
:mod:`alma_daemon.training.distributed`) every method is the identity, and the loop is the
one-process loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from alma_daemon.data.tensors import LabeledData
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.ranks import World, current_world
from alma_daemon.training.validated import Validated


@dataclass(frozen=True)
class DataParallel(World):
    """This rank's part of a data-parallel fit: slice ``rank`` of ``size`` of every batch (0 of 1: alone)."""

    @classmethod
    def across_ranks(cls) -> DataParallel:
        """The ranks of the process group torchrun started, or alone without one."""
        world = current_world()
        return cls(world.rank, world.size)

    @property
    def spans_ranks(self) -> bool:
        return self.size > 1

    def own(self) -> tuple[Any, ...]:
        """What to add to a generator's purpose so that each rank draws its own numbers."""
        return ("rank", self.rank) if self.spans_ranks else ()

    def wrap(self, net: nn.Module, device: torch.device, batch_size: int) -> nn.Module:
        """``net`` whose backward pass averages gradients over the ranks; ``net`` itself alone.

        Call once the optimizer made the parameters views into its flat buffer: DDP registers its
        hooks on the parameters as they are then.
        """
        if not self.spans_ranks:
            return net
        # check_config_under_ranks refuses such a config at start-up; this guards other callers.
        if batch_size < self.size:
            raise ValueError(f"train.batch_size ({batch_size}) is smaller than the number of ranks ({self.size})")
        # Every parameter takes part in every forward pass here (a Switch layer runs even an expert no
        # token reaches, on no rows), so DDP need not search the graph for unused ones at each step.
        return DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)

    def take(self, batch: torch.Tensor) -> torch.Tensor | None:
        """This rank's slice of a batch of indices; None (on every rank) for a batch too small to split."""
        if not self.spans_ranks:
            return batch
        if len(batch) < self.size:
            return None
        return batch[self.part_of(len(batch))]

    def part_of(self, count: int) -> slice:
        """This rank's part of ``count`` items: near-equal consecutive parts, the first ones one longer."""
        base, extra = divmod(count, self.size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + int(self.rank < extra))

    def loss_share(self, part: int, whole: int) -> float:
        """The factor on a slice's mean loss that makes DDP's average of the ranks' gradients the batch mean."""
        return part * self.size / whole

    def sync_buffers(self, net: nn.Module) -> None:
        """Rank 0's buffers (BatchNorm statistics) everywhere, as DDP does before each forward pass."""
        if self.spans_ranks:
            for buffer in net.buffers():
                dist.broadcast(buffer, src=0)

    def validate(
        self,
        validate: Callable[[nn.Module, LabeledData, FlopMeter], float],
        net: nn.Module,
        val: LabeledData,
        meter: FlopMeter,
    ) -> float:
        """``validate``'s measure (a mean over examples) on the whole of ``val``, each rank measuring its slice;
        its standard error, where each slice's has one, is that of the mean of the slices' means."""
        if not self.spans_ranks:
            return validate(net, val, meter)
        part = val.subset(self.part_of(len(val)))
        measure = validate(net, part, meter) if len(part) else 0.0
        spread = getattr(measure, "standard_error", math.nan) * len(part) if len(part) else 0.0
        combined = torch.tensor(
            [measure * len(part), len(part), spread * spread], dtype=torch.float64, device=val.y.device
        )
        dist.all_reduce(combined)
        return mean_of_slices(*combined.tolist())

    def summed(self, *values: float) -> list[float]:
        """Each value summed over the ranks (float64 holds a stage's FLOP count exactly)."""
        if not self.spans_ranks:
            return list(values)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        total = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return total.tolist()


def mean_of_slices(total: float, examples: float, spread_squared: float) -> float:
    """The mean over every slice of a validation set from the slices' sums: ``total`` (each slice's mean times
    its examples), ``examples`` and ``spread_squared`` (each slice's standard error times its examples,
    squared; NaN where a slice's measure has none). With a standard error where every slice had one."""
    if not examples:
        return math.nan
    error = math.sqrt(spread_squared) / examples
    return total / examples if math.isnan(error) else Validated(total / examples, error)
