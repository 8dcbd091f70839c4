"""Device selection (CUDA when available, the CPU otherwise) and the threads that run beside training."""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from alma_daemon.config import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device for config ``device``; under torchrun each rank of a machine takes its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    if "LOCAL_RANK" not in os.environ:
        return device
    if device.index is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"device: {name!r} would put every rank on one GPU; use 'cuda' or 'auto' under torchrun")
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]))


def run_beside_training() -> None:
    """Call first in a thread that runs torch ops beside the training thread (publisher, replay).

    PyTorch's CPU kernels use OpenMP, and GNU OpenMP gives every thread that opens a parallel
    region a team of its own. Once a second team exists, more OpenMP threads than cores are alive,
    and libgomp then cuts its spin-wait to a fraction: every parallel region of the training thread
    pays a futex sleep and wake-up, which made training stages 2.5-4x slower beside the publisher
    (docs/service.md, "Threads"). With one OpenMP thread this thread's ops run inline and no team
    is created. The setting is made through OpenMP itself because it is then this thread's alone:
    ``torch.set_num_threads`` would also become the default of every thread that has not yet run a
    torch op, a training thread started later included. The lower scheduling priority (Linux: per
    thread) lets training win what contention is left.
    """
    torch.get_num_threads()  # torch initializes this thread's OpenMP settings on first use: before ours
    omp_set_num_threads = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)
    if omp_set_num_threads is not None:
        omp_set_num_threads(1)
    else:  # OpenMP not loaded globally (another torch build): the process-wide setting is what is left
        torch.set_num_threads(1)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
    except (AttributeError, OSError):
        pass  # not Linux, or not permitted: one OpenMP thread already removes the contention that matters


#: Nice increment of background threads that run torch ops (0-19; higher yields more).
BACKGROUND_NICENESS = 10
