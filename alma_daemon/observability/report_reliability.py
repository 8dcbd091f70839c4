"""``reliability.png`` in ``alma report``: whether a binary task's served probabilities mean what they say.

Every step of a binary task records the reliability of its prequential sample (``reliability`` in the
rows, core/records.py): the positive class's probabilities the version served (calibrated,
measures/decision.py), measured before the model trained on them, binned between
:data:`~alma_daemon.measures.decision.RELIABILITY_EDGES`, with per bin the examples, the sum of their
probabilities and the positives. The figure sums the bins over each run's second half (the served
window of observability/served_measure.py) and draws, per configuration, each bin's observed share of
positives against its mean probability: on the diagonal, examples served 0.05 are positive 5 % of the
time. Under it, the examples per bin.

Where most examples were served a probability under 0.1 (a rare positive class: fraud), both axes are
logarithmic and the bins below 0.1 are the recorded 1-2-5 steps; otherwise the axes are linear and the
bins are the tenths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from alma_daemon.measures.decision import RELIABILITY_EDGES
from alma_daemon.observability.figures import (
    RunLike,
    _finish,
    _order_key,
    configurations,
    describe,
    headline,
    plt,
)
from alma_daemon.observability.served_measure import judged_steps
from alma_daemon.observability.ticks import label_log

RELIABILITY_PLOT = ("reliability.png", "reliability: the served probability against the share observed positive")
#: A bin with fewer examples is left out of the reliability panel (its share says little), and drawn
#: hollow in the counts panel.
FEW_EXAMPLES = 20
#: The axes are logarithmic where at least this share of the examples was served a probability under 0.1.
CROWDED_SHARE = 0.5
#: The bins drawn on linear axes (tenths) and on logarithmic ones (the recorded steps below 0.1, then tenths).
LINEAR_EDGES = tuple(round(0.1 * i, 1) for i in range(11))
LOG_EDGES = tuple(edge for edge in RELIABILITY_EDGES if edge < 0.1) + LINEAR_EDGES[1:]
#: The normal quantile of a 95 % interval.
_Z = 1.96


@dataclass(frozen=True)
class Bin:
    """A bin of served probabilities in [low, high): its examples, their probabilities' sum, its positives."""

    low: float
    high: float
    examples: float
    probabilities: float
    positives: float

    @property
    def served(self) -> float:
        """The mean probability served."""
        return self.probabilities / self.examples

    @property
    def observed(self) -> float:
        """The share of positives."""
        return self.positives / self.examples

    def interval(self) -> tuple[float, float]:
        """Wilson's 95 % interval of the share of positives."""
        n, k, z2 = self.examples, self.positives, _Z * _Z
        centre = (k + z2 / 2) / (n + z2)
        half = _Z * math.sqrt(max(0.0, k * (n - k) / n) + z2 / 4) / (n + z2)
        return max(0.0, centre - half), min(1.0, centre + half)


def recorded(runs: Sequence[RunLike]) -> list[RunLike]:
    """The runs whose rows hold reliability bins (a binary task's, written since they were recorded)."""
    return [run for run in runs if any(row.get("reliability") for row in run.series)]


def served_bins(runs: Sequence[RunLike]) -> list[list[float]] | None:
    """The recorded bins summed over the served window of every run (the last half of its steps, as the
    served measure's); None where no row of those windows holds them."""
    width = len(RELIABILITY_EDGES) - 1
    total = [[0.0, 0.0, 0.0] for _ in range(width)]
    found = False
    for run in runs:
        for row in judged_steps(run.series):
            bins = row.get("reliability")
            if not bins or len(bins) != width:  # none, or another version's bins
                continue
            found = True
            for acc, values in zip(total, bins):
                for i in range(3):
                    acc[i] += float(values[i])
    return total if found else None


def merged(bins: Sequence[Sequence[float]], edges: Sequence[float]) -> list[Bin]:
    """The recorded ``bins`` merged into the bins between ``edges`` (some of the recorded edges, 0 and 1 among them)."""
    out = []
    for low, high in pairwise(edges):
        parts = [b for (lo, hi), b in zip(pairwise(RELIABILITY_EDGES), bins) if lo >= low and hi <= high]
        out.append(Bin(low, high, *(sum(float(b[i]) for b in parts) for i in range(3))))
    return out


def positive_name(runs: Sequence[RunLike]) -> str:
    """The positive class as the runs' config names it (``task.positive_class``, else the second of
    ``task.classes``); "positive" where it names none."""
    task = runs[0].config.get("task", {}) if runs else {}
    if task.get("positive_class"):
        return str(task["positive_class"])
    classes = task.get("classes") or []
    return str(classes[1]) if len(classes) == 2 else "positive"


def plot_reliability(runs: Sequence[RunLike], path: Path) -> bool:
    """The served probabilities' reliability over each configuration's second half (see the module's
    docstring); False, and nothing drawn, where no run recorded it."""
    runs = recorded(runs)
    groups = sorted(configurations(runs).items(), key=lambda item: _order_key(dict(item[0])))
    summed = [(config, sums) for config, group in groups if (sums := served_bins(group)) is not None]
    examples = sum(b[0] for _, sums in summed for b in sums)
    if not examples:
        return False
    positives = sum(b[2] for _, sums in summed for b in sums)
    under = sum(b[0] for _, sums in summed for (_, high), b in zip(pairwise(RELIABILITY_EDGES), sums) if high <= 0.1)
    log = under >= CROWDED_SHARE * examples
    edges = LOG_EDGES if log else LINEAR_EDGES
    drawn = [(config, [b for b in merged(sums, edges) if b.examples]) for config, sums in summed]
    shown = [b for _, bins in drawn for b in bins if b.examples >= FEW_EXAMPLES]
    if log:
        # From under the smallest point to 1, the same on both axes; a bin without a positive is drawn at
        # the upper end of its interval (a share below it, and not 0 on a log axis).
        values = [v for b in shown for v in (b.served, b.observed or b.interval()[1]) if v > 0]
        lim = (min(values, default=0.01) / 2, 1.3)
    else:
        lim = (0.0, 1.0)

    fig, (ax, counts) = plt.subplots(2, 1, figsize=(7.5, 7.2), sharex=True, height_ratios=(3, 1), layout="constrained")
    ax.plot(lim, lim, linestyle=(0, (5, 3)), linewidth=1.0, color="0.5", zorder=1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    single = len(drawn) == 1
    for i, (config, bins) in enumerate(drawn):
        color = colors[i % len(colors)]
        read = [b for b in bins if b.examples >= FEW_EXAMPLES]
        hit = [b for b in read if b.positives or not log]
        ax.plot(
            [b.served for b in hit],
            [b.observed for b in hit],
            marker="o",
            markersize=5,
            linewidth=1.0,
            color=color,
            alpha=0.7,
            label=describe(dict(config)),
        )
        for b in hit:
            lower, upper = b.interval()
            ax.errorbar(
                [b.served],
                [b.observed],
                yerr=[[b.observed - lower], [upper - b.observed]],
                fmt="o",
                markersize=5,
                color=color,
                elinewidth=0.8,
                capsize=2,
                zorder=3,
            )
        missed = [b for b in read if log and not b.positives]
        ax.plot(
            [b.served for b in missed],
            [b.interval()[1] for b in missed],
            "v",
            markersize=6,
            color=color,
            markerfacecolor="none",
            linestyle="none",
        )
        counts.plot([b.served for b in bins], [b.examples for b in bins], linewidth=1.0, color=color)
        for few in (False, True):
            some = [b for b in bins if (b.examples < FEW_EXAMPLES) == few]
            counts.plot(
                [b.served for b in some],
                [b.examples for b in some],
                "o",
                markersize=3.5,
                color=color,
                markerfacecolor="none" if few else color,
                linestyle="none",
            )
        if single:
            for b in bins:
                counts.annotate(
                    f"{b.examples:,.0f}",
                    (b.served, b.examples),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    fontsize=7,
                )
    name = positive_name(runs)
    scale = (
        f"log scale: {positives / examples:.1%} of the examples are {name}"
        if log
        else f"{positives / examples:.1%} are {name}"
    )
    counts.set_xlabel(f"served probability of {name}, mean per bin ({scale})")
    ax.set_ylabel(f"share observed {name}" + (" (log scale)" if log else ""))
    counts.set_ylabel("examples per bin")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    counts.set_yscale("log")
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)
    # Room above the most examples for their count's label (a single configuration's).
    counts_range = (0.5, max(b.examples for _, bins in drawn for b in bins) * (6 if single else 2))
    counts.set_ylim(*counts_range)
    # Plain numbers (0.001, 0.01; 100, 10k), as a reader of probabilities and counts reads them.
    if log:
        label_log(ax.xaxis, *lim)
        label_log(ax.yaxis, *lim)
    label_log(counts.yaxis, *counts_range)
    ax.grid(alpha=0.3)
    counts.grid(alpha=0.3)
    ax.set_title(f"share of {name} observed against the probability served, per bin", fontsize=9)
    notes = [
        "each run's second half of chunks, each measured before the model trained on it",
        "dashed: calibrated (the diagonal)",
        "bars: 95 % interval",
    ]
    if any(b.examples < FEW_EXAMPLES for _, bins in drawn for b in bins):
        notes.append(f"hollow below: bins of under {FEW_EXAMPLES} examples, left out above")
    if log and any(not b.positives for b in shown):
        notes.append(f"▽: no {name} in the bin, at the top of its interval")
    title, legend = "Reliability of the served probabilities", None
    if single:
        total = f" (sum of {len(runs)} runs)" if len(runs) > 1 else ""
        title = f"{title}: {headline(runs[0])}{total}"
    else:
        seeds = max(len(group) for _, group in groups)
        legend = f"configuration (sum of up to {seeds} runs)" if seeds > 1 else "configuration"
    _finish(fig, title, notes, legend, path)
    return True
