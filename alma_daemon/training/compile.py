"""``train.compile``: the training loop's forward passes through ``torch.compile``, where a compiler is present.

Inductor needs a C++ compiler for CPU kernels and Triton for CUDA ones; without them the loop runs
eager and says why once. On CUDA the compiled module also replays its kernels as CUDA graphs
(``mode="reduce-overhead"``), which removes the per-kernel launch cost of small models. Dynamo
keeps compiled code per forward function, guarded on the module, so the next stage of a stream
reuses it (growth, a new shape or train/eval mode recompile).
Compilation takes seconds to minutes, which is why the key is off by default: it pays on long
stages and on GPUs, not on the few-second stages of the CPU examples (README, benchmarks).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import cast

import torch
from torch import nn

log = logging.getLogger(__name__)

_warned: set[str] = set()


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot build kernels for ``device`` here, or None when it can."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    if device.type == "cpu":
        compiler = os.environ.get("CXX", "g++")  # what Inductor runs
        return None if shutil.which(compiler) else f"no C++ compiler ({compiler!r}) on PATH"
    return f"no compiler support for {device.type}"


def compiled(net: nn.Module, device: torch.device) -> nn.Module:
    """``net`` compiled for ``device``, or ``net`` itself where no compiler is present."""
    reason = compiler_missing(device)
    if reason is not None:
        if reason not in _warned:
            _warned.add(reason)
            log.warning("train.compile: running eager", extra={"reason": reason})
        return net
    # The stubs type the result as a plain callable; given a Module, torch.compile returns an
    # OptimizedModule, a Module wrapping it.
    return cast(nn.Module, torch.compile(net, mode="reduce-overhead" if device.type == "cuda" else None))
