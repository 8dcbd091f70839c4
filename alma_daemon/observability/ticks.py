"""Axes a person reads: log axes labelled with plain numbers, none repeated, and notes that wrap.

A log axis over less than a decade or two (the training FLOPs of policies on one stream differ by a few
percent) gets matplotlib's minor labels, which repeat (``3.5e9, 3.5e9, 3.6e9``) or run into each other.
:func:`log_axis` labels a few ticks instead: the 1-2-5 steps where at least three fall in the range,
evenly spaced round numbers otherwise, each written as a plain number with an SI suffix (``350M``,
``3.5G``, ``12G``) to as many digits as tell them apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.ticker import FixedFormatter, FixedLocator, LogLocator, MaxNLocator, NullFormatter

#: SI prefixes, largest first: a FLOP count reads ``3.5G``, a parameter count ``120k``.
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
#: The most labelled ticks on a log axis: more would crowd a 7-inch axis.
MOST_TICKS = 7
#: The least: with fewer, a reader cannot tell the scale.
LEAST_TICKS = 3


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits as a plain decimal (never ``3.5e+02``), trailing zeros cut."""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def plain(value: float, digits: int = 2) -> str:
    """``3.5G``, ``120M``, ``12k``, ``0.02``: ``value`` to ``digits`` significant digits, an SI suffix from
    a thousand on."""
    for size, prefix in _PREFIXES:
        if abs(value) >= size:
            return _significant(value / size, digits) + prefix
    return _significant(value, digits)


def distinct_labels(values: Sequence[float]) -> list[str]:
    """:func:`plain` labels of ``values`` with the fewest significant digits (1 to 6) that write each one
    exactly (a tick at 12.5G is not labelled ``12G``), and so tell them apart."""
    labels: list[str] = []
    for digits in range(1, 7):
        labels = [plain(v, digits) for v in values]
        exact = all(math.isclose(float(f"{v:.{digits}g}"), v, rel_tol=1e-9) for v in values)
        if exact and len(set(labels)) == len(labels):
            break
    return labels


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks of a log axis from ``low`` to ``high`` (both > 0): the 1-2-5 steps, else the 1-3 steps, else
    the powers of ten, the first of which puts :data:`LEAST_TICKS` to :data:`MOST_TICKS` in the range
    (every few powers of ten over many decades); evenly spaced round numbers where not even the 1-2-5
    steps put :data:`LEAST_TICKS` in it (within a decade or so)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))

    def within(steps: tuple[float, ...]) -> list[float]:
        return [m * 10.0**e for e in range(first, last + 1) for m in steps if low <= m * 10.0**e <= high]

    if len(within((1.0, 2.0, 5.0))) < LEAST_TICKS:
        return round_ticks(low, high)
    for steps in ((1.0, 2.0, 5.0), (1.0, 3.0)):
        if len(ticks := within(steps)) <= MOST_TICKS:
            return ticks
    powers = within((1.0,))
    return powers[:: math.ceil(len(powers) / MOST_TICKS)]


def round_ticks(low: float, high: float) -> list[float]:
    """Evenly spaced round numbers (steps of 1, 2, 2.5 or 5 times a power of ten) from ``low`` to
    ``high``: the fewest bins that put :data:`LEAST_TICKS` in the range."""
    ticks: list[float] = []
    for bins in range(4, 10):
        found = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
        ticks = [float(t) for t in found if low <= t <= high]
        if len(ticks) >= LEAST_TICKS:
            break
    return ticks


def log_range(values: Sequence[float], pad: float = 0.06) -> tuple[float, float]:
    """The range of a log axis over the positive ``values``, ``pad`` of its log width beyond each end
    (a factor of 1.5 either side of a single value)."""
    positive = [v for v in values if v > 0]
    low, high = min(positive), max(positive)
    if high <= low * 1.0001:
        return low / 1.5, high * 1.5
    margin = (math.log10(high) - math.log10(low)) * pad
    return low / 10**margin, high * 10**margin


def log_axis(ax: Axes, which: str, values: Sequence[float]) -> None:
    """Make ``ax``'s ``which`` axis ("x" or "y") logarithmic over ``values`` (:func:`log_range`),
    labelled by :func:`label_log`."""
    low, high = log_range(values)
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    (ax.set_xlim if which == "x" else ax.set_ylim)(low, high)
    label_log(ax.xaxis if which == "x" else ax.yaxis, low, high)


def label_log(axis: Axis, low: float, high: float) -> None:
    """Label a log ``axis`` from ``low`` to ``high`` with :func:`log_ticks` in :func:`distinct_labels`;
    its minor ticks unlabelled."""
    ticks = log_ticks(low, high)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FixedFormatter(distinct_labels(ticks)))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_minor_formatter(NullFormatter())


def wrapped(notes: Sequence[str], width: int = 110) -> str:
    """The notes joined by "; ", a line break before one that would run past ``width`` characters."""
    lines = [""]
    for note in notes:
        if lines[-1] and len(lines[-1]) + 2 + len(note) > width:
            lines[-1] += ";"
            lines.append("")
        lines[-1] += f"; {note}" if lines[-1] else note
    return "\n".join(lines)
