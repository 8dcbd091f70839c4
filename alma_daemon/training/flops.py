"""FLOP counting with PyTorch's FLOP formulas (``torch.utils.flop_counter``) on real steps.

Counting every step under a dispatch mode would slow training several fold. A step's FLOPs depend
on the architecture and the input shape, so :class:`FlopMeter` counts the first real step of each
shape and adds that figure for later steps of the same shape. One exception, an approximation: a
Switch layer in training skips the expert FFN for tokens over an expert's capacity, so its steps'
FLOPs also depend on the routing, and the stage's later steps are counted at the first step's
routing (docs/language-modeling.md). The counting mode is
``FlopCounterMode``'s, without its per-module breakdown, whose module hooks cost more than the
count itself (the totals are the same, tests/test_flops.py checks).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

T = TypeVar("T")


class _TotalFlops(TorchDispatchMode):
    """Sums the FLOP formula of every op that runs, first decomposing what decomposes (as FlopCounterMode does)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.ops.prim.device.default:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def count_flops(fn: Callable[[], T]) -> tuple[T, int]:
    """Run ``fn`` once under the FLOP counter; return its result and the FLOPs it executed."""
    with _TotalFlops() as counter:
        result = fn()
    return result, int(counter.total)


class FlopMeter:
    """Accumulates FLOPs of repeated operations, counting each distinct ``key`` once for real."""

    def __init__(self) -> None:
        self.total = 0
        self._per_key: dict[Hashable, int] = {}

    def run(self, key: Hashable, fn: Callable[[], T], counted: Callable[[], T] | None = None) -> T:
        """Run ``fn`` and add its FLOPs; the first time ``key`` is seen, run ``counted`` (default ``fn``)
        under the counter instead: an eager twin of a compiled ``fn``, whose kernels the counter cannot see."""
        if key in self._per_key:
            result = fn()
        else:
            result, flops = count_flops(counted or fn)
            self._per_key[key] = flops
        self.total += self._per_key[key]
        return result

    def share(self, key: Hashable) -> int:
        """FLOPs counted for one run of ``key`` (0 if never run)."""
        return self._per_key.get(key, 0)
