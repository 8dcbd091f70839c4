"""Device selection: CUDA when available (``device: auto``), the CPU otherwise."""

from __future__ import annotations

import os

import torch


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # Under torchrun each rank on a machine takes its own GPU.
        return torch.device("cuda", int(os.environ["LOCAL_RANK"])) if "LOCAL_RANK" in os.environ else torch.device("cuda")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    return device
