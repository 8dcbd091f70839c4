"""Independent ensemble members trained in parallel by the processes torchrun starts.

``torchrun --nproc_per_node N -m alma_daemon simulate ...`` starts N ranks, and each runs the same
engine on the same stream. Where a learner trains independent members (Ens, gEns and their language
model versions), member i trains on rank i mod N; then every rank receives every member's weights and
training report, so all ranks hold the same model, take the same decisions and record what a
one-process run records. A member's shuffling, augmentation and dropout come from generators seeded
by its index, and torch's global RNG is reseeded by its index too before a member trains alone
(stacked members draw nothing from it), so nothing it draws depends on which rank trains it or on
what trained before it. Rank 0 alone
writes results and checkpoints. Collectives run on gloo for CPU models and NCCL for CUDA ones.
Learners that train one network split its batches over the ranks instead
(:mod:`alma_daemon.training.data_parallel`).
"""

from __future__ import annotations

import functools
import gc
import math
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from alma_daemon.seeding import derive_seed
from alma_daemon.training.loop import FitReport
from alma_daemon.training.ranks import World, current_world, launched_with_ranks

#: How long a rank waits at a collective. A rank that trains one member more than another waits a
#: whole member's training, hours at paper scale; a rank that fails is stopped by torchrun, which
#: then stops the others, so a long wait never hides a failure.
COLLECTIVE_TIMEOUT = timedelta(hours=24)


def join_process_group(device: torch.device) -> World:
    """Join the ranks torchrun started (its environment says how many); a lone process stays alone."""
    if launched_with_ranks() and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return current_world()


def leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        # Objects the last stage left in reference cycles may still hold the group (and gloo's worker
        # threads, which end only with it): collected now, the threads are joined here. Left to the
        # interpreter's exit, they abort the process ("terminate called without an active
        # exception") while another rank is still running.
        gc.collect()


#: ``fit_together(members) -> {index: report}`` trains several members at once, or returns None where it cannot.
FitTogether = Callable[[Sequence[tuple[int, nn.Module]]], "dict[int, FitReport] | None"]


def train_members(
    members: Sequence[tuple[int, nn.Module]],
    fit_one: Callable[[int, nn.Module], FitReport],
    seed: int,
    fit_together: FitTogether | None = None,
) -> FitReport:
    """Train each ``(index, member)``, spread over the ranks; their reports merged in the given order.

    A rank trains its members together with ``fit_together`` where it can (stacked, see
    :mod:`alma_daemon.training.members`), else one after another with ``fit_one``. Either gives each
    member the same result, so the split over ranks does not change it.
    """
    if not members:
        return FitReport()
    world = current_world()
    local = [(index, member) for index, member in members if index % world.size == world.rank]
    reports = (fit_together(local) if fit_together is not None and local else None) or {}
    for index, member in local:
        if index not in reports:
            torch.manual_seed(derive_seed(seed, "member", index))
            reports[index] = fit_one(index, member)
    if world.size > 1:
        reports = _share(members, reports, world)
    return functools.reduce(FitReport.merge, (reports[index] for index, _ in members), FitReport())


#: The FitReport fields exchanged between ranks, in table column order.
_REPORT_FIELDS = ("flops", "seconds", "steps", "epochs", "best_epoch", "val_error")


def _share(
    members: Sequence[tuple[int, nn.Module]], reports: dict[int, FitReport], world: World
) -> dict[int, FitReport]:
    """Every member's weights from the rank that trained it, and every member's report, on every rank."""
    device = next(members[0][1].parameters()).device
    # float64 holds integers up to 2**53 exactly: FLOP counts of a stage stay far below.
    table = torch.zeros(len(members), len(_REPORT_FIELDS), dtype=torch.float64, device=device)
    for row, (index, _) in enumerate(members):
        if index in reports:
            values = [getattr(reports[index], name) for name in _REPORT_FIELDS]
            table[row] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(table)
    for index, member in members:
        for tensor in member.state_dict().values():
            dist.broadcast(tensor, src=index % world.size)
    shared = {}
    for row, (index, _) in enumerate(members):
        flops, seconds, steps, epochs, best_epoch, val_error = table[row].tolist()
        shared[index] = FitReport(
            flops=int(flops),
            seconds=seconds,
            steps=int(steps),
            epochs=int(epochs),
            best_epoch=int(best_epoch),
            val_error=None if math.isnan(val_error) else val_error,
        )
    return shared
