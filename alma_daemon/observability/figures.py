"""The figures of a report as a reader of the paper expects them, for any set of runs.

- CER against cumulative training FLOPs or parameters (the paper's Fig. 2): log axes, one line per
  (method, size), joining its waiting times in order, named in a legend;
- test error against mega-batches (Fig. 3): one curve per configuration, its y range set by the
  curves once they have trained, so an untrained model's plateau does not squeeze the others;
- replay as arrows from the run without replay to the same run with it (Fig. 4).

Runs are grouped by the config values that differ between them: runs that differ only in their
seeds are one configuration, drawn at the mean over the seeds; runs that differ only in the policy's
keys are one line. A run is anything with ``config``, ``summary`` and ``series`` (the rows of its
results.json), as :class:`alma_daemon.observability.report.Run` has.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter, ScalarFormatter

#: Config keys that only reseed a run: runs differing in these alone are averaged.
SEED_KEYS = frozenset({"seed", "stream.seed"})
#: The prefix of the keys a line joins (the waiting times and other policy settings).
POLICY_PREFIX = "policy."
REPLAY_KEY = "stream.replay"


class RunLike(Protocol):
    @property
    def config(self) -> dict: ...

    @property
    def summary(self) -> dict: ...

    @property
    def series(self) -> list[dict]: ...


def flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        else:
            out[name] = value
    return out


def varying_keys(runs: Sequence[RunLike]) -> list[str]:
    """The config keys whose values differ between the runs, seeds left out."""
    flats = [flat(run.config) for run in runs]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if k not in SEED_KEYS and len({repr(f.get(k)) for f in flats}) > 1]


def describe(params: dict) -> str:
    """A short name for a configuration: ``ens width=4 wait=10 replay``. A key the configuration does
    not have (``learner.members`` of an SM beside an Ens) is left out, not shown as ``members=None``."""
    parts: list[str] = []
    for key, value in params.items():
        leaf = key.split(".")[-1]
        if value is None:
            continue
        if key == "learner.name":
            parts.insert(0, str(value))
        elif key == REPLAY_KEY:
            parts.append("replay" if value else "no replay")
        else:
            parts.append(f"{leaf}={value}")
    return " ".join(parts) or "run"


def _params(run: RunLike, keys: list[str]) -> dict:
    f = flat(run.config)
    # Lists (dataset.files, dataset.input_shape) as tuples: the values group runs as dict keys.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in ((k, f.get(k)) for k in keys)}


def _order_key(params: dict) -> tuple:
    return tuple((str(type(v)), v if isinstance(v, int | float) else str(v)) for v in params.values())


def configurations(runs: Sequence[RunLike]) -> dict[tuple, list[RunLike]]:
    """Runs grouped by configuration (same values of the varying keys, seeds aside)."""
    keys = varying_keys(runs)
    groups: dict[tuple, list[RunLike]] = defaultdict(list)
    for run in runs:
        groups[tuple(_params(run, keys).items())].append(run)
    return dict(groups)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def cer_lines(runs: Sequence[RunLike], x_key: str, y_key: str) -> dict[str, list[tuple[float, float, dict]]]:
    """Per line (configuration without its policy keys): its points (x, y, policy params), in order."""
    lines: dict[str, list[tuple[float, float, dict]]] = defaultdict(list)
    for config, group in configurations(runs).items():
        xs = [r.summary.get(x_key) or 0.0 for r in group]
        ys = [r.summary.get(y_key) for r in group]
        if any(x <= 0 for x in xs) or any(y is None for y in ys):
            continue
        params = dict(config)
        line = {k: v for k, v in params.items() if not k.startswith(POLICY_PREFIX)}
        policy = {k: v for k, v in params.items() if k.startswith(POLICY_PREFIX)}
        lines[describe(line)].append((_mean(xs), _mean([float(y) for y in ys if y is not None]), policy))
    for points in lines.values():
        points.sort(key=lambda p: (_order_key(p[2]), p[0]))
    return dict(sorted(lines.items(), key=lambda item: natural(item[0])))


def natural(text: str) -> list:
    """Sort key that puts ``width=8`` before ``width=16``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _style(label: str, labels) -> tuple[str, str]:
    """A line's color and marker: one color per method (the label's first word, as the paper colors
    its methods), one marker per size within a method."""
    methods = sorted({name.split(" ")[0] for name in labels})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    method = label.split(" ")[0]
    if len(methods) == 1:  # one method: the sizes get the colors
        ordered = sorted(labels, key=natural)
        return colors[ordered.index(label) % len(colors)], _MARKERS[0]
    siblings = sorted((name for name in labels if name.split(" ")[0] == method), key=natural)
    return colors[methods.index(method) % len(colors)], _MARKERS[siblings.index(label) % len(_MARKERS)]


def _legend(ax, count: int) -> None:
    if count > 8:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    elif count:
        ax.legend(fontsize="small")


def plot_cer_lines(runs: Sequence[RunLike], x_key: str, x_label: str, y_key: str, y_label: str, path: Path) -> None:
    """CER (``y_key``) against a cost (``x_key``): one line per (method, size) joining its waits."""
    lines = cer_lines(runs, x_key, y_key)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, points in lines.items():
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        color, marker = _style(label, lines)
        ax.plot(xs, ys, marker=marker, markersize=5, color=color, label=label)
        if len(points) > 1:  # the smallest wait hollow, so a reader sees which way the waits grow
            ax.plot(xs[:1], ys[:1], marker=marker, markersize=8, markerfacecolor="white", color=color)
    ax.set_xscale("log")
    ys_all = [p[1] for points in lines.values() for p in points]
    # a log y axis only where the CERs span a decade; within one, log ticks are unreadable
    log_y = bool(ys_all) and min(ys_all) > 0 and max(ys_all) / min(ys_all) >= 10
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())  # a label on every minor tick of a short decade overlaps
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(f"{y_label} (log)" if log_y else y_label)
    waits = {k for points in lines.values() for p in points for k in p[2]}
    if waits:
        ax.set_title(f"one line per configuration, joining its {', '.join(sorted(waits))} (hollow: first)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    _legend(ax, len(lines))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def mean_curve(group: list[RunLike], key: str) -> tuple[list[int], list[float], int | None]:
    """The test measure after every chunk, averaged over a configuration's seeds, and the first
    chunk after which the run had trained (None if it never did)."""
    values: dict[int, list[float]] = defaultdict(list)
    first_trained = None
    for run in group:
        for row in run.series:
            if row.get(key) is not None:
                values[row["t"]].append(row[key])
            if row.get("trained") and (first_trained is None or row["t"] < first_trained):
                first_trained = row["t"]
    ts = sorted(values)
    return ts, [_mean(values[t]) for t in ts], first_trained


def plot_error_curves(runs: Sequence[RunLike], key: str, y_label: str, path: Path, log: bool = False) -> None:
    """``key`` (a per-chunk measure) against mega-batches received, one curve per configuration.

    The y range covers every curve from its first training stage on; an untrained model's error
    (about 0.9 on ten classes) above it is cut, as the caption says."""
    groups = configurations(runs)
    keys = varying_keys(runs)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    shown: list[float] = []
    everything: list[float] = []
    for config, group in sorted(groups.items(), key=lambda item: _order_key(dict(item[0]))):
        ts, ys, first = mean_curve(group, key)
        if not ts:
            continue
        marker = "." if len(ts) <= 50 else None
        ax.plot(ts, ys, marker=marker, linewidth=1.2, label=describe(dict(config)) if keys else "run")
        everything += ys
        shown += [y for t, y in zip(ts, ys, strict=True) if first is not None and t >= first]
    ax.set_xlabel("mega-batches received")
    ax.set_ylabel(y_label)
    if log:
        ax.set_yscale("log")
    elif shown and max(everything) > max(shown):
        low, high = min(shown), max(shown)
        margin = 0.05 * (high - low or high or 1.0)
        ax.set_ylim(max(0.0, low - margin), high + margin)
        ax.set_title("y range: the curves after their first training stage (untrained models cut)", fontsize=9)
    ax.grid(alpha=0.3)
    _legend(ax, len(groups))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def replay_pairs(
    runs: Sequence[RunLike], x_key: str, y_key: str
) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """Configurations run both without and with replay: (name, (x, y) without, (x, y) with)."""
    if REPLAY_KEY not in varying_keys(runs):
        return []
    points: dict[tuple, dict[bool, tuple[float, float]]] = defaultdict(dict)
    names = {}
    for config, group in configurations(runs).items():
        params = dict(config)
        replay = bool(params.pop(REPLAY_KEY))
        xs = [r.summary.get(x_key) for r in group]
        ys = [r.summary.get(y_key) for r in group]
        if any(v is None for v in xs + ys):
            continue
        key = tuple(params.items())
        points[key][replay] = (
            _mean([float(x) for x in xs if x is not None]),
            _mean([float(y) for y in ys if y is not None]),
        )
        names[key] = describe(params)
    return [
        (names[k], p[False], p[True]) for k, p in sorted(points.items(), key=lambda kv: names[kv[0]]) if len(p) == 2
    ]


def plot_replay_arrows(runs: Sequence[RunLike], x_key: str, x_label: str, y_key: str, y_label: str, path: Path) -> bool:
    """Fig. 4: an arrow per configuration from its run without replay to its run with replay, over
    every run as a grey dot. Returns False (and draws nothing) when no configuration has both."""
    pairs = replay_pairs(runs, x_key, y_key)
    if not pairs:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    others = [
        (float(r.summary[x_key]), float(r.summary[y_key]))
        for r in runs
        if r.summary.get(x_key) and r.summary.get(y_key) is not None
    ]
    if others:
        ax.scatter([x for x, _ in others], [y for _, y in others], s=8, color="0.75", label="every run", zorder=1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, start, end) in enumerate(pairs):
        color = colors[i % len(colors)]
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": color, "lw": 1.5})
        ax.scatter([start[0], end[0]], [start[1], end[1]], color=color, s=18, label=name, zorder=2)
    ax.set_xscale("log")
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(y_label)
    ax.set_title("replay: arrow from the run without it to the same run with it", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    _legend(ax, len(pairs) + 1)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True
