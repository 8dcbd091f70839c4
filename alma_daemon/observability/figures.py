"""The figures of a report as a reader of the paper expects them, for any set of runs.

- CER against cumulative training FLOPs or parameters (the paper's Fig. 2): log axes, one line per
  (method, size), joining its waiting times in order, named in a legend;
- test error against mega-batches (Fig. 3), with the prequential error in a panel under it: one
  curve per configuration, the y range set by the curves once they have trained, so an untrained
  model's plateau does not squeeze the others;
- replay as arrows from the run without replay to the same run with it (Fig. 4);
- the model's age after each chunk, in chunks and in time since the last stage, with the freshness
  bound that forces a stage.

Runs are grouped by the values that differ between them of the keys that say what a run learns
(:data:`LEARNING_SECTIONS`: learner, policy, stream, train, dataset, task); where a run kept its state and
which servers it talked to (``daemon.*``, ``kafka.*``, ``redis.*``, ...) never name or split a
configuration. Runs that differ only in their seeds are one configuration, drawn at the mean over
the seeds; runs that differ only in the policy's keys are one line; a run stopped before its
stream's end is told apart as ``(5 of 10 chunks)``. Every figure has a title; its legend, titled,
sits right of the axes, and names each configuration by its learner and the keys that differ; a
figure of one configuration names it in its title instead. A CER plot of a single point is not
drawn. A run is anything with ``config``, ``summary`` and ``series`` (the rows of
its results.json), as :class:`alma_daemon.observability.report.Run` has.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, ScalarFormatter

from policies import policy_config_models

#: Config keys that only reseed a run: runs differing in these alone are averaged.
SEED_KEYS = frozenset({"seed", "stream.seed"})
#: The config sections that say what a run learns: only their keys name and split configurations.
LEARNING_SECTIONS = ("learner", "policy", "stream", "train", "dataset", "task")
#: Keys of those sections that say where the data lies, not what it is.
WHERE_KEYS = frozenset({"dataset.root"})
#: The prefix of the keys a line joins (the waiting times and other policy settings).
POLICY_PREFIX = "policy."
#: Policies whose keys are their waits, fixed before the stream starts: every key of theirs is shown.
SCHEDULE_POLICIES = frozenset({"fixed", "geometric"})
REPLAY_KEY = "stream.replay"
#: A pseudo key: the chunks a run processed, a configuration's key where runs stopped at different chunks.
CHUNKS_KEY = "chunks"
#: Legend names of keys whose leaf alone would not say what they are.
_NAMES = {"stream.megabatches": "B", "policy.name": "policy", "dataset.name": "dataset"}
#: The keys that name a single configuration in its figures' titles, where they are set.
HEADLINE_KEYS = (
    "learner.name",
    "learner.model",
    "learner.width",
    "learner.members",
    "learner.d_model",
    "learner.experts",
    "policy.name",
    "policy.wait",
    "policy.ratio",
    "policy.cron",
    "policy.interval_seconds",
    "policy.flops_per_hour",
    "policy.gpu_seconds_per_hour",
    "stream.megabatches",
    "stream.chunk_examples",
    "stream.chunk_seconds",
    "task.measure",
    REPLAY_KEY,
)
#: Headline keys left out where one of the others is set: a team's own network (``learner.model``) has
#: no backbone width; an event stream's chunks are cut every N examples or T seconds, not one of B.
SUPERSEDED_KEYS = {
    "learner.width": ("learner.model",),
    "stream.megabatches": ("stream.chunk_examples", "stream.chunk_seconds"),
}
#: A legend value longer than this is cut to its end (a path's end names it).
_LONGEST_VALUE = 24


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


def processed(run: RunLike) -> int:
    """The chunks a run has processed (its summary's ``chunks``; older results: its rows)."""
    chunks = run.summary.get("chunks")
    return int(chunks) if chunks is not None else len(run.series)


def stream_length(run: RunLike) -> int | None:
    """B, the chunks of the run's stream; None for an event stream, whose chunks are cut from events."""
    stream = run.config.get("stream", {})
    if stream.get("chunk_examples") is not None or stream.get("chunk_seconds") is not None:
        return None
    return stream.get("megabatches")


def cut_short(run: RunLike) -> str | None:
    """``5 of 10`` for a run that processed fewer chunks than its stream has (a daemon stopped by
    ``--until-chunks``, a run still going); None for a finished one or an event stream."""
    done, total = processed(run), stream_length(run)
    return f"{done} of {total}" if total is not None and done < total else None


def learning_key(key: str) -> bool:
    """Whether a config key says what a run learns (not where it keeps state, nor its seed)."""
    return key.split(".")[0] in LEARNING_SECTIONS and key not in WHERE_KEYS and key not in SEED_KEYS


def varying_keys(runs: Sequence[RunLike]) -> list[str]:
    """The learning keys (:func:`learning_key`) whose values differ between the runs, then
    :data:`CHUNKS_KEY` where some runs stopped short of their stream's end and others did not, or
    stopped elsewhere: a CER over 5 chunks is not one over 10."""
    flats = [flat(run.config) for run in runs]
    keys = sorted({k for f in flats for k in f if learning_key(k)})
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    if len({cut_short(run) for run in runs}) > 1:
        varying.append(CHUNKS_KEY)
    return varying


def _value(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return text if len(text) <= _LONGEST_VALUE else "…" + text[-(_LONGEST_VALUE - 1) :]


def describe(params: dict) -> str:
    """A short name for a configuration: ``ens width=4 wait=10 replay``. A key the configuration does
    not have (``learner.members`` of an SM beside an Ens) is left out, not shown as ``members=None``."""
    parts: list[str] = []
    for key, value in params.items():
        if value is None:
            continue
        if key == "learner.name":
            parts.insert(0, str(value))
        elif key == REPLAY_KEY:
            parts.append("replay" if value else "no replay")
        elif key == CHUNKS_KEY:
            parts.append(f"({value} chunks)")
        else:
            parts.append(f"{_NAMES.get(key, key.split('.')[-1])}={_value(value)}")
    return " ".join(parts) or "run"


def headline(run: RunLike) -> str:
    """What one run is, for the title of a figure of a single configuration:
    ``sm width=8 policy=fixed wait=1 B=10 no replay (5 of 10 chunks)``; a team's model on an event
    stream: ``sm model=fraud:build policy=adaptive chunk_examples=1000 measure=recall no replay``."""
    f = flat(run.config)
    f[CHUNKS_KEY] = cut_short(run)
    for key, by in SUPERSEDED_KEYS.items():
        if any(f.get(other) is not None for other in by):
            f[key] = None
    return describe({k: f.get(k) for k in (*HEADLINE_KEYS, CHUNKS_KEY)})


@functools.cache
def policy_defaults(name: Any) -> dict[str, Any]:
    """The dotted ``policy.*`` keys a decision-making policy (not a schedule: ``fixed``, ``geometric``, whose
    waits name them) leaves at their defaults; a legend leaves them out (``policy=forecast``, not every
    key of forecast's section)."""
    model = None if name in SCHEDULE_POLICIES else policy_config_models().get(name)
    return flat({"policy": dataclasses.asdict(model())}) if model else {}


def _params(run: RunLike, keys: list[str]) -> dict:
    f = flat(run.config)
    f[CHUNKS_KEY] = cut_short(run)
    defaults = policy_defaults(f.get("policy.name"))
    # The policy's name before its keys, so a legend reads "policy=forecast compute_price=1e-11".
    ordered = [k for k in keys if k != "policy.name"]
    if "policy.name" in keys:
        first = next((i for i, k in enumerate(ordered) if k.startswith(POLICY_PREFIX)), len(ordered))
        ordered.insert(first, "policy.name")
    params = {}
    for key in ordered:
        value = f.get(key)
        if key != "policy.name" and key in defaults and defaults[key] == value:
            value = None
        # Lists (dataset.files, dataset.input_shape) as tuples: the values group runs as dict keys.
        params[key] = tuple(value) if isinstance(value, list) else value
    return params


def _order_key(params: dict) -> tuple:
    return tuple((str(type(v)), v if isinstance(v, int | float) else str(v)) for v in params.values())


def configurations(runs: Sequence[RunLike]) -> dict[tuple, list[RunLike]]:
    """Runs grouped by configuration (same values of the varying keys, seeds aside), each keyed by
    those values and the learner's name, which a legend always starts with."""
    varying = varying_keys(runs)
    keys = varying if "learner.name" in varying else ["learner.name", *varying]
    groups: dict[tuple, list[RunLike]] = defaultdict(list)
    for run in runs:
        groups[tuple(_params(run, keys).items())].append(run)
    return dict(groups)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def _legend_title(groups: Sequence[Sequence[RunLike]]) -> str:
    seeds = max((len(group) for group in groups), default=1)
    return f"configuration (mean of up to {seeds} runs)" if seeds > 1 else "configuration"


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
#: Line styles of the error curves, taken in turn once the colors run out.
_DASHES = ("-", "--", ":", "-.")


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


def _figure(panels: int = 1):
    """A figure of ``panels`` axes one above the other (one x and one y range), whose title, legend
    and note, placed outside the axes, are laid out with it."""
    height = 4.8 if panels == 1 else 3.3 * panels
    fig, axes = plt.subplots(
        panels, 1, figsize=(7.5, height), sharex=True, sharey=True, squeeze=False, layout="constrained"
    )
    return fig, list(axes[:, 0])


def _finish(fig, title: str, note: str | None, legend_title: str | None, path: Path) -> None:
    """Title on top, the legend right of the axes (never over a curve nor an axis label), the note
    under the axes; saved and closed."""
    fig.suptitle(title, fontsize=11)
    if note:
        fig.supxlabel(note, fontsize=8, color="0.35")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    if legend_title is not None and handles:
        legend = fig.legend(
            handles,
            labels,
            loc="outside right upper",
            title=legend_title,
            fontsize="small" if len(handles) <= 12 else "x-small",
            title_fontsize="small",
            frameon=False,
        )
        # The layout takes the legend's width from the axes: widen the figure by as much instead.
        fig.canvas.draw()
        fig.set_figwidth(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _short_number(x: float, _position=None) -> str:
    """``2e8``, ``6.5e10``: a tick label of a log axis between its powers of ten."""
    if x <= 0:
        return ""
    exponent = math.floor(math.log10(x))
    return f"{x / 10**exponent:.2g}e{exponent}"


def _log_x(ax, xs: list[float]) -> None:
    """A log x axis; within a decade or so, where at most one power of ten falls, the 2s and 5s are
    labeled too, so the axis is never left with a single number."""
    ax.set_xscale("log")
    low, high = min(xs), max(xs)
    if high / low < 20:
        ax.xaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.xaxis.set_minor_formatter(FuncFormatter(_short_number))
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())  # a label on every minor tick of a short decade overlaps


def plot_cer_lines(runs: Sequence[RunLike], x_key: str, x_label: str, y_key: str, y_label: str, path: Path) -> bool:
    """CER (``y_key``) against a cost (``x_key``): one line per (method, size) joining its waits.

    Returns False, and draws nothing, where there is less than two points to compare (a single run
    is one dot: its CER and cost are in the report's table)."""
    lines = cer_lines(runs, x_key, y_key)
    if sum(len(points) for points in lines.values()) < 2:
        return False
    fig, (ax,) = _figure()
    for label, points in lines.items():
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        color, marker = _style(label, lines)
        ax.plot(xs, ys, marker=marker, markersize=5, color=color, label=label)
        if len(points) > 1:  # the smallest wait hollow, so a reader sees which way the waits grow
            ax.plot(xs[:1], ys[:1], marker=marker, markersize=8, markerfacecolor="white", color=color)
    _log_x(ax, [p[0] for points in lines.values() for p in points])
    ys_all = [p[1] for points in lines.values() for p in points]
    # a log y axis only where the CERs span a decade; within one, log ticks are unreadable
    log_y = min(ys_all) > 0 and max(ys_all) / min(ys_all) >= 10
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(f"{y_label} (log)" if log_y else y_label)
    ax.grid(alpha=0.3, which="both")
    waits = sorted({k for points in lines.values() for p in points for k in p[2]})
    note = f"one line per configuration, joining its {', '.join(waits)} (hollow: first)" if waits else None
    _finish(
        fig, f"{_capital(y_label)} against {x_label}", note, _legend_title(list(configurations(runs).values())), path
    )
    return True


def mean_curve(group: list[RunLike], key: str) -> tuple[list[int], list[float], int | None]:
    """The measure ``key`` after every chunk, averaged over a configuration's seeds, and the first
    chunk after which the run had trained (None if it never did)."""
    values: dict[int, list[float]] = defaultdict(list)
    first_trained = None
    for run in group:
        for row in run.series:
            # Not taken (None), or not defined on the data (NaN: a recall on a chunk without a positive).
            if row.get(key) is not None and math.isfinite(row[key]):
                values[row["t"]].append(row[key])
            if row.get("trained") and (first_trained is None or row["t"] < first_trained):
                first_trained = row["t"]
    ts = sorted(values)
    return ts, [_mean(values[t]) for t in ts], first_trained


def plot_error_curves(
    runs: Sequence[RunLike],
    panels: Sequence[tuple[str, str]],
    y_label: str,
    path: Path,
    log: bool = False,
    *,
    axis_label: str | None = None,
    baseline: tuple[str, str] | None = None,
    title: str | None = None,
    references: Mapping[str, str] | None = None,
) -> None:
    """Per-chunk measures against mega-batches received, one curve per configuration, one panel per
    (row key, panel title) of ``panels``, one above the other on the same axes' ranges: the test error
    beside the prequential error. ``y_label`` names the measure in the title (``title`` replaces it),
    ``axis_label`` on the y axes (default: ``y_label``).

    ``baseline`` (row key, words): each configuration's baseline as a dashed line of its color in the
    first panel, the set it was measured on (the test set, else the chunk), named in the note.

    ``references`` (panel row key -> row key): in those panels, each configuration's reference learner
    (a linear model learnt on the same stream, core/reference.py) as a dotted line of its color.

    The y range covers every curve from its first training stage on, and the baselines; an untrained
    model's error (about 0.9 on ten classes) above it is cut, as the note under the axes says. A
    prequential measure is taken before the chunk trains, so it counts as trained from the chunk after."""
    groups = configurations(runs)
    keys = varying_keys(runs)
    fig, axes = _figure(len(panels))
    shown: list[float] = []
    everything: list[float] = []
    ordered = sorted(groups.items(), key=lambda item: _order_key(dict(item[0])))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, panel) in zip(axes, panels, strict=True):
        after = 1 if key.startswith("prequential_") else 0
        for i, (config, group) in enumerate(ordered):
            ts, ys, first = mean_curve(group, key)
            if not ts:
                continue
            marker = "." if len(ts) <= 50 else None
            color, dashes = colors[i % len(colors)], _DASHES[i // len(colors) % len(_DASHES)]
            ax.plot(ts, ys, dashes, marker=marker, linewidth=1.2, color=color, label=describe(dict(config)))
            everything += ys
            shown += [y for t, y in zip(ts, ys, strict=True) if first is not None and t >= first + after]
            reference = (references or {}).get(key)
            if reference is not None:
                rts, rys, _ = mean_curve(group, reference)
                ax.plot(rts, rys, linestyle=(0, (1, 2)), linewidth=1.2, color=color)
                everything += rys
                shown += rys[1:]  # its first chunk's, before it learnt anything, is cut like an untrained model's
            if baseline is not None and ax is axes[0]:
                bts, bys, _ = mean_curve(group, baseline[0])
                ax.plot(bts, bys, linestyle=(0, (5, 3)), linewidth=1.0, color=color)
                everything += bys
                shown += bys
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel(axis_label or y_label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("mega-batches received")
    notes = []
    if baseline is not None and any(mean_curve(group, baseline[0])[0] for group in groups.values()):
        notes.append(f"dashed: {baseline[1]}, a model that ignores its inputs")
    if any(mean_curve(group, key)[0] for key in (references or {}).values() for group in groups.values()):
        notes.append("dotted: the reference, a linear model learnt on the same stream")
    if log:
        axes[0].set_yscale("log")
    elif shown and max(everything) > max(shown):
        low, high = min(shown), max(shown)
        margin = 0.05 * (high - low or high or 1.0)
        axes[0].set_ylim(max(0.0, low - margin), high + margin)
        notes.append("y range: the curves after their first training stage (untrained models cut)")
    note = "; ".join(notes) or None
    title = title or f"{_capital(y_label)} after each mega-batch"
    if keys:
        legend: str | None = _legend_title(list(groups.values()))
    else:  # one configuration: the title names it, a legend would only say "run"
        mean = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
        title, legend = f"{title}: {headline(runs[0])}{mean}", None
    _finish(fig, title, note, legend, path)


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
    fig, (ax,) = _figure()
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
    _log_x(ax, [x for x, _ in others] + [p[0] for _, start, end in pairs for p in (start, end)])
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3, which="both")
    note = "arrow: from a configuration's run without replay to the same run with it"
    _finish(fig, f"Replay: {y_label} against {x_label}", note, "configuration", path)
    return True


#: Units of the model's age in time, largest first: (seconds in one, name); the figure takes the first
#: its longest age reaches twice.
_AGE_UNITS = ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))


def _age_unit(longest: float) -> tuple[float, str]:
    return next(((size, name) for size, name in _AGE_UNITS if longest >= 2 * size), _AGE_UNITS[-1])


def plot_model_age(runs: Sequence[RunLike], path: Path) -> bool:
    """The model's age after each chunk: chunks (top) and time (bottom) since the last training stage,
    one curve per configuration (0 on a chunk that trained), each configuration's freshness bound
    (``policy.max_model_age_chunks`` / ``max_model_age_seconds``) a dashed line of its color where it
    falls within the curves' range (the note names the others). False, and nothing drawn, where no run
    recorded the model's age (results written before it was kept)."""
    if not any(row.get("model_age_chunks") is not None for run in runs for row in run.series):
        return False
    groups = configurations(runs)
    ordered = sorted(groups.items(), key=lambda item: _order_key(dict(item[0])))
    longest = max((row.get("model_age_seconds") or 0.0 for run in runs for row in run.series), default=0.0)
    unit, unit_name = _age_unit(longest)
    fig, axes = plt.subplots(2, 1, figsize=(7.5, 6.6), sharex=True, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn_bounds, above = False, set()
    panels = (("model_age_chunks", "max_model_age_chunks", 1.0), ("model_age_seconds", "max_model_age_seconds", unit))
    for ax, (key, bound_key, scale) in zip(axes, panels, strict=True):
        top = 1.0
        for i, (config, group) in enumerate(ordered):
            ts, ys, _ = mean_curve(group, key)
            if ts:
                ys = [y / scale for y in ys]
                dashes = _DASHES[i // len(colors) % len(_DASHES)]
                marker = "." if len(ts) <= 50 else None
                ax.plot(
                    ts,
                    ys,
                    dashes,
                    marker=marker,
                    linewidth=1.2,
                    color=colors[i % len(colors)],
                    label=describe(dict(config)),
                )
                top = max(top, *ys)
        for i, (_, group) in enumerate(ordered):
            for bound in sorted({b for run in group if (b := run.config.get("policy", {}).get(bound_key))}):
                # A day's bound over a simulation's seconds would flatten every curve: named in the note.
                if bound / scale <= 5 * top:
                    ax.axhline(bound / scale, linestyle=(0, (5, 3)), linewidth=1.0, color=colors[i % len(colors)])
                    drawn_bounds = True
                else:
                    above.add(f"policy.{bound_key}={bound:g}")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_title("chunks since the last training stage", fontsize=9)
    axes[0].set_ylabel("chunks")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set_title("time since the last training stage", fontsize=9)
    axes[1].set_ylabel(unit_name)
    axes[1].set_xlabel("mega-batches received")
    notes = ["dashed: the freshness bound, which forces a stage"] if drawn_bounds else []
    if above:
        notes.append(f"bound above the plot: {', '.join(sorted(above))}")
    title = "Model age after each mega-batch"
    if varying_keys(runs):
        legend: str | None = _legend_title(list(groups.values()))
    else:  # one configuration: the title names it
        mean = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
        title, legend = f"{title}: {headline(runs[0])}{mean}", None
    _finish(fig, title, "; ".join(notes) or None, legend, path)
    return True
