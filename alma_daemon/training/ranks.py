"""This process's place among the ranks torchrun started: what every multi-process path reads first."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """This process's place among the ranks: ``rank`` of ``size`` (0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_ranks() -> int:
    """How many ranks torchrun started (1 without torchrun), known before the process group is joined."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_with_ranks() -> bool:
    """Whether torchrun started this process as one of several ranks."""
    return launched_ranks() > 1


def current_world() -> World:
    """The process group's rank and size once joined; alone (0 of 1) before or without one."""
    import torch.distributed as dist  # here: the command line reads launched_ranks() without torch

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()
