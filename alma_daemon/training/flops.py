"""FLOP counting with ``torch.utils.flop_counter.FlopCounterMode`` on real steps.

Counting every step under the counter's dispatch mode would slow training several fold. A step's
FLOPs depend only on the architecture and the input shape, so :class:`FlopMeter` counts the first
real step of each shape under the counter and adds that figure for later steps of the same shape.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from torch.utils.flop_counter import FlopCounterMode

T = TypeVar("T")


def count_flops(fn: Callable[[], T]) -> tuple[T, int]:
    """Run ``fn`` once under the FLOP counter; return its result and the FLOPs it executed."""
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return result, int(counter.get_total_flops())


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
