"""Device selection: CUDA when available (``device: auto``), the CPU otherwise."""

from __future__ import annotations

import os

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
