"""The figures of a report as a reader of the paper expects them, for any set of runs.

- CER against cumulative training FLOPs or parameters (the paper's Fig. 2): log axes labelled with
  plain numbers (observability/ticks.py), one line per configuration and policy, joining a schedule's
  waiting times in order, named in a legend;
- test error against mega-batches (Fig. 3), with the prequential error in a panel under it: one
  curve per configuration, the y range set by the curves once they have trained, so an untrained
  model's plateau does not squeeze the others (its points beyond are triangles on the edge); over
  :data:`MOST_POINTS` chunks, each point the mean of a block of chunks;
- replay as arrows from the run without replay to the same run with it (Fig. 4);
- the model's age after each chunk, in chunks and in time since the last stage: a backtest's in its
  history's time (its rows' ``chunk_time``) where the history has a time column, a daemon's in the
  time its chunks arrived; with the freshness bound that forces a stage.

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
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from alma_daemon.observability.ticks import log_axis, wrapped
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
    def config(self) -> dict[str, Any]: ...

    @property
    def summary(self) -> dict[str, Any]: ...

    @property
    def series(self) -> list[dict[str, Any]]: ...


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
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


#: Where a value cut to its end may start: after one of these (``…tabular:build``, not ``…es.tabular:build``).
_SEPARATORS = "/.:"


def _value(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    if len(text) <= _LONGEST_VALUE:
        return text
    tail = text[-(_LONGEST_VALUE - 1) :]
    if text[-len(tail) - 1] not in _SEPARATORS:
        # Not cut at a separator: start after the tail's first one, so no name is cut in two.
        at = min((i for i in map(tail.find, _SEPARATORS) if i >= 0), default=-1)
        tail = tail[at + 1 :] if 0 <= at < len(tail) - 1 else tail
    return "…" + tail


def describe(params: dict[str, Any]) -> str:
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


def _params(run: RunLike, keys: list[str]) -> dict[str, Any]:
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


def _order_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((str(type(v)), v if isinstance(v, int | float) else str(v)) for v in params.values())


def configurations(runs: Sequence[RunLike]) -> dict[tuple[Any, ...], list[RunLike]]:
    """Runs grouped by configuration (same values of the varying keys, seeds aside), each keyed by
    those values and the learner's name, which a legend always starts with."""
    varying = varying_keys(runs)
    keys = varying if "learner.name" in varying else ["learner.name", *varying]
    groups: dict[tuple[Any, ...], list[RunLike]] = defaultdict(list)
    for run in runs:
        groups[tuple(_params(run, keys).items())].append(run)
    return dict(groups)


def _mean(values: Sequence[float]) -> float:
    # sum / len, not statistics.fmean: a curve of 2,000 chunks of 12 runs takes tens of thousands.
    return sum(values) / len(values)


def _legend_title(groups: Sequence[Sequence[RunLike]]) -> str:
    seeds = max((len(group) for group in groups), default=1)
    return f"configuration (mean of up to {seeds} runs)" if seeds > 1 else "configuration"


def cer_lines(runs: Sequence[RunLike], x_key: str, y_key: str) -> dict[str, list[tuple[float, float, dict[str, Any]]]]:
    """Per line: its points (x, y, the policy key it joins and its value), in order of that value.

    A line is one configuration but for the one policy key it joins (:func:`joined_key`: a schedule's
    waits, as the paper's Fig. 2 joins them); runs of different policies are different lines, so no line
    runs from a fixed schedule to an adaptive policy as if they were one configuration."""
    families: dict[tuple[Any, ...], list[tuple[dict[str, Any], float, float]]] = defaultdict(list)
    for config, group in configurations(runs).items():
        xs = [r.summary.get(x_key) or 0.0 for r in group]
        ys = [r.summary.get(y_key) for r in group]
        if any(x <= 0 for x in xs) or any(y is None for y in ys):
            continue
        params = dict(config)
        family = {k: v for k, v in params.items() if not k.startswith(POLICY_PREFIX) or k == "policy.name"}
        families[tuple(family.items())].append((params, _mean(xs), _mean([float(y) for y in ys if y is not None])))
    # The key joined is a policy's, over all its configurations: its lines of one point are named alike.
    by_policy: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for members in families.values():
        by_policy[members[0][0].get("policy.name")] += [params for params, _, _ in members]
    joined_keys = {name: joined_key(params) for name, params in by_policy.items()}
    lines: dict[str, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for members in families.values():
        joined = joined_keys[members[0][0].get("policy.name")]
        for params, x, y in members:
            line = {k: v for k, v in params.items() if k != joined}
            lines[describe(line)].append((x, y, {joined: params.get(joined)} if joined else {}))
    for points in lines.values():
        points.sort(key=lambda p: (_order_key(p[2]), p[0]))
    return dict(sorted(lines.items(), key=lambda item: natural(item[0])))


#: The policy keys a CER line joins, in order of preference, where one of them differs between the runs
#: of one policy: a schedule's wait, a geometric schedule's ratio, a price.
JOINED_KEYS = ("policy.wait", "policy.ratio", "policy.compute_price")


def joined_key(members: Sequence[dict[str, Any]]) -> str | None:
    """The policy key a line joins the configurations ``members`` (of one policy) along: the first of
    :data:`JOINED_KEYS` whose values differ between them, else the first other policy key that does; None
    where none does (one point)."""
    keys = sorted({k for params in members for k in params if k.startswith(POLICY_PREFIX) and k != "policy.name"})
    varying = [k for k in keys if len({repr(params.get(k)) for params in members}) > 1]
    return next((k for k in JOINED_KEYS if k in varying), varying[0] if varying else None)


def natural(text: str) -> list[Any]:
    """Sort key that puts ``width=8`` before ``width=16``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Line styles of the error curves, taken in turn once the colors run out.
_DASHES = ("-", "--", ":", "-.")


def _style(label: str, labels: Collection[str]) -> tuple[str, str]:
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


def _figure(panels: int = 1) -> tuple[Any, list[Any]]:
    """A figure of ``panels`` axes one above the other (one x and one y range), whose title, legend
    and note, placed outside the axes, are laid out with it."""
    height = 4.8 if panels == 1 else 3.3 * panels
    fig, axes = plt.subplots(
        panels, 1, figsize=(7.5, height), sharex=True, sharey=True, squeeze=False, layout="constrained"
    )
    return fig, list(axes[:, 0])


def _finish(fig: Any, title: str, note: str | Sequence[str] | None, legend_title: str | None, path: Path) -> None:
    """Title on top, the legend right of the axes (never over a curve nor an axis label), the note
    (or notes, joined by "; " and wrapped) under the axes; saved and closed. The title and the note are
    centred over the axes, not the figure: a title longer than the axes are wide (a single
    configuration's names all of it) wraps there, clear of the legend."""
    title_text = fig.suptitle(title, fontsize=11, wrap=True)
    text = note if isinstance(note, str) or note is None else wrapped(note)
    note_text = fig.supxlabel(text, fontsize=8, color="0.35") if text else None
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
        # The layout takes the legend's width from the axes: widen the figure by as much instead (its
        # width is its text's, known without drawing the figure).
        axes_width = fig.get_figwidth()
        fig.set_figwidth(axes_width + legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi)
        # A centred text wraps at twice its distance to the nearer edge: centred over the axes, at their width.
        for centred in (title_text, note_text):
            if centred is not None:
                centred.set_x(axes_width / 2 / fig.get_figwidth())
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def plot_cer_lines(runs: Sequence[RunLike], x_key: str, x_label: str, y_key: str, y_label: str, path: Path) -> bool:
    """CER (``y_key``) against a cost (``x_key``): one line per configuration, joining its waits
    (:func:`cer_lines`); a configuration of one point is a marker alone.

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
    log_axis(ax, "x", [p[0] for points in lines.values() for p in points])
    ys_all = [p[1] for points in lines.values() for p in points]
    # a log y axis only where the CERs span a decade; within one, a linear axis reads better
    log_y = min(ys_all) > 0 and max(ys_all) / min(ys_all) >= 10
    if log_y:
        log_axis(ax, "y", ys_all)
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(f"{y_label} (log)" if log_y else y_label)
    ax.grid(alpha=0.3, which="major")
    joined = sorted({k.removeprefix(POLICY_PREFIX) for points in lines.values() for p in points for k in p[2]})
    note = f"one line per configuration, joining its {' and '.join(joined)} (hollow: the smallest)" if joined else None
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


#: A curve of more chunks than this is drawn in blocks of consecutive chunks, about :data:`BLOCKS` of
#: them: a point per chunk over 2,000 chunks is a band of noise that no reader can follow.
MOST_POINTS = 250
BLOCKS = 100
#: A curve of at most this many points marks each one.
_MARKED_POINTS = 50


def block_size(runs: Sequence[RunLike], most: int = MOST_POINTS, blocks: int = BLOCKS) -> int:
    """The chunks each point of the runs' curves stands for: 1, or where a series is longer than
    ``most`` chunks, as many as make about ``blocks`` points of the longest."""
    longest = max((len(run.series) for run in runs), default=0)
    return 1 if longest <= most else math.ceil(longest / blocks)


def in_blocks(
    ts: Sequence[int], ys: Sequence[float], size: int, combine: Callable[[list[float]], float] = _mean
) -> tuple[list[float], list[float], list[int]]:
    """The points (t, y) by blocks of ``size`` consecutive chunks (1 to size, size + 1 to 2 size, ...): per
    block, its chunks' mean t, ``combine`` of its values, and its first chunk (the points as they are
    where ``size`` is 1)."""
    blocks: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for t, y in zip(ts, ys, strict=True):
        blocks[(t - 1) // size].append((t, y))
    points = [blocks[b] for b in sorted(blocks)]
    return (
        [_mean([t for t, _ in block]) for block in points],
        [combine([y for _, y in block]) for block in points],
        [block[0][0] for block in points],
    )


#: A curve as drawn: its axes, x and y values and color (:func:`_mark_beyond` reads them).
_Drawn = tuple[Any, list[float], list[float], str]


#: The color of a line every configuration shares (their common baseline).
_SHARED_COLOR = "0.35"


def _companion_curves(
    ordered: Sequence[tuple[tuple[Any, ...], list[RunLike]]], key: str, colors: Sequence[str]
) -> list[tuple[str, list[int], list[float]]]:
    """Each configuration's curve of ``key`` (color, ts, ys), where it is a line drawn beside the
    configuration's own (its baseline, its reference learner): one grey curve where every configuration
    recorded the same (one test set, one stream), so that a dozen lines do not lie on top of each other."""
    curves = [(colors[i % len(colors)], *mean_curve(group, key)[:2]) for i, (_, group) in enumerate(ordered)]
    curves = [(color, ts, ys) for color, ts, ys in curves if ts]
    if len(curves) > 1 and all((ts, ys) == (curves[0][1], curves[0][2]) for _, ts, ys in curves):
        return [(_SHARED_COLOR, curves[0][1], curves[0][2])]
    return curves


def _mark_beyond(drawn: Sequence[_Drawn]) -> dict[str, list[float]]:
    """Draw each point of ``drawn`` beyond its axes' y range as a triangle on the range's edge (above:
    ▲, below: ▼); return those points' values by triangle."""
    beyond: dict[str, list[float]] = defaultdict(list)
    for ax, xs, ys, color in drawn:
        bottom, top = ax.get_ylim()
        for sign, marker, edge, outside in (("▲", "^", top, 1.0), ("▼", "v", bottom, -1.0)):
            points = [(x, y) for x, y in zip(xs, ys, strict=True) if (y - edge) * outside > 0]
            if points:
                ax.plot([x for x, _ in points], [edge] * len(points), marker, color=color, markersize=6, clip_on=False)
                beyond[sign] += [y for _, y in points]
    return dict(beyond)


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
    ``axis_label`` on the y axes (default: ``y_label``). Over more than :data:`MOST_POINTS` chunks, each
    point is the mean of a block of chunks (:func:`block_size`), as the note says.

    ``baseline`` (row key, words): each configuration's baseline as a dashed line of its color in every
    panel (they all show the one measure; a team's bill is its prequential panel), one grey line where
    every configuration recorded the same; ``words`` name it, and the set it was measured on, in the note.

    ``references`` (panel row key -> row key): in those panels, each configuration's reference learner
    (a linear model learnt on the same stream, core/reference.py) as a dotted line of its color.

    The y range covers every curve from its first training stage on, and the baselines; an untrained
    model's points beyond it (an error of about 0.9 on ten classes) are drawn as triangles on its edge,
    as the note under the axes says. A prequential measure is taken before the chunk trains, so it counts
    as trained from the chunk after."""
    groups = configurations(runs)
    fig, axes = _figure(len(panels))
    shown: list[float] = []
    drawn: list[_Drawn] = []
    ordered = sorted(groups.items(), key=lambda item: _order_key(dict(item[0])))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    size = block_size(runs)
    baselines = _companion_curves(ordered, baseline[0], colors) if baseline is not None else []
    referenced: list[tuple[str, list[int], list[float]]] = []
    for ax, (key, panel) in zip(axes, panels, strict=True):
        after = 1 if key.startswith("prequential_") else 0
        for i, (config, group) in enumerate(ordered):
            ts, ys, first = mean_curve(group, key)
            if not ts:
                continue
            xs, values, starts = in_blocks(ts, ys, size)
            color, dashes = colors[i % len(colors)], _DASHES[i // len(colors) % len(_DASHES)]
            marker = "." if len(xs) <= _MARKED_POINTS else None
            ax.plot(xs, values, dashes, marker=marker, linewidth=1.2, color=color, label=describe(dict(config)))
            drawn.append((ax, xs, values, color))
            shown += [v for s, v in zip(starts, values, strict=True) if first is not None and s >= first + after]
        reference = (references or {}).get(key)
        for color, rts, rys in _companion_curves(ordered, reference, colors) if reference is not None else []:
            rxs, rvalues, _ = in_blocks(rts, rys, size)
            ax.plot(rxs, rvalues, linestyle=(0, (1, 2)), linewidth=1.2, color=color, gid="reference")
            drawn.append((ax, rxs, rvalues, color))
            shown += rvalues[1:]  # its first chunk's, before it learnt anything, is cut like an untrained model's
            referenced.append((color, rts, rys))
        for color, bts, bys in baselines:
            bxs, bvalues, _ = in_blocks(bts, bys, size)
            ax.plot(bxs, bvalues, linestyle=(0, (5, 3)), linewidth=1.0, color=color, gid="baseline")
            drawn.append((ax, bxs, bvalues, color))
            shown += bvalues
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel(axis_label or y_label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("mega-batches received")
    notes = _curve_notes(baseline, baselines, referenced, size)
    notes += _y_range(axes, drawn, shown, log)
    title = title or f"{_capital(y_label)} after each mega-batch"
    if varying_keys(runs):
        legend: str | None = _legend_title(list(groups.values()))
    else:  # one configuration: the title names it, a legend would only say "run"
        mean = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
        title, legend = f"{title}: {headline(runs[0])}{mean}", None
    _finish(fig, title, notes, legend, path)


def _curve_notes(
    baseline: tuple[str, str] | None,
    baselines: Sequence[tuple[str, list[int], list[float]]],
    references: Sequence[tuple[str, list[int], list[float]]],
    size: int,
) -> list[str]:
    """What the dashed (``baselines`` drawn) and dotted (``references`` drawn) lines are, and what a
    point stands for where it is a block's mean."""
    shared = " (grey: the same for every configuration)"
    notes = []
    if baseline is not None and baselines:
        grey = shared if baselines[0][0] == _SHARED_COLOR else ""
        notes.append(f"dashed: {baseline[1]}, a model that ignores its inputs{grey}")
    if references:
        grey = shared if all(color == _SHARED_COLOR for color, _, _ in references) else ""
        notes.append(f"dotted: the reference, a linear model learnt on the same stream{grey}")
    if size > 1:
        notes.append(f"each point: the mean over {size} consecutive chunks")
    return notes


def _y_range(axes: Sequence[Any], drawn: Sequence[_Drawn], shown: Sequence[float], log: bool) -> list[str]:
    """Set the panels' shared y range (log for a perplexity): the trained curves' and the baselines'
    (``shown``), where some point lies beyond it; that point a triangle on its edge. The note's words
    for the cut, if any."""
    if log:
        axes[0].set_yscale("log")
        return []
    everything = [v for _, _, values, _ in drawn for v in values]
    if not shown or (max(everything) <= max(shown) and min(everything) >= min(shown)):
        return []
    low, high = min(shown), max(shown)
    margin = 0.05 * (high - low or abs(high) or 1.0)
    axes[0].set_ylim(max(0.0, low - margin) if min(everything) >= 0 else low - margin, high + margin)
    beyond = _mark_beyond(drawn)
    if not beyond:
        return []
    words = {"▲": ("above", "highest", max), "▼": ("below", "lowest", min)}
    where = " or ".join(words[sign][0] for sign in beyond)
    extremes = ", ".join(f"{words[sign][1]} {words[sign][2](values):.3g}" for sign, values in beyond.items())
    return [
        f"y range: the curves after their first training stage; {' '.join(beyond)}: an untrained point {where} "
        f"it, drawn on its edge ({extremes})"
    ]


def replay_pairs(
    runs: Sequence[RunLike], x_key: str, y_key: str
) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """Configurations run both without and with replay: (name, (x, y) without, (x, y) with)."""
    if REPLAY_KEY not in varying_keys(runs):
        return []
    points: dict[tuple[Any, ...], dict[bool, tuple[float, float]]] = defaultdict(dict)
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
    log_axis(ax, "x", [x for x, _ in others] + [p[0] for _, start, end in pairs for p in (start, end)])
    ax.set_xlabel(f"{x_label} (log)")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3, which="major")
    note = "arrow: from a configuration's run without replay to the same run with it"
    _finish(fig, f"Replay: {y_label} against {x_label}", note, "configuration", path)
    return True


#: Units of the model's age in time, largest first: (seconds in one, name); the figure takes the first
#: its longest age reaches twice.
_AGE_UNITS = ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))


def _age_unit(longest: float) -> tuple[float, str]:
    return next(((size, name) for size, name in _AGE_UNITS if longest >= 2 * size), _AGE_UNITS[-1])


#: Why a backtest's model age is drawn in chunks only.
REPLAYED_AGE = (
    "a backtest replays its history as fast as this machine trains: its age in seconds is not the "
    "history's time, and is not drawn"
)


def history_time(value: Any) -> float | None:
    """A row's ``chunk_time`` as a number: an ISO 8601 date-time's seconds since the epoch (UTC where it
    names no zone), a number as it is; None where the row has none (or an unreadable one)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def history_ages(run: RunLike) -> tuple[list[int], list[float]]:
    """A backtest's model age after each step in its history's time: the step's ``chunk_time`` less that
    of the newest chunk the last stage trained on (the chunk of the step that trained it), 0 on a step
    that trained. Seconds for date-times, the time column's own units for numbers. Left out: the steps
    before the first stage (the rows do not say when the history began, so an untrained model has no
    age in its time; the chunks panel has them) and steps without a ``chunk_time``."""
    ts: list[int] = []
    ages: list[float] = []
    since: float | None = None
    for row in sorted(run.series, key=lambda row: row["t"]):
        now = history_time(row.get("chunk_time"))
        if now is None:
            continue
        if row.get("trained"):
            since = now
        if since is not None:
            ts.append(row["t"])
            ages.append(max(0.0, now - since))
    return ts, ages


def history_time_kind(runs: Sequence[RunLike]) -> str | None:
    """ "date-time" or "number": how the runs' rows write their chunks' time (``chunk_time``); None where
    no row has one (a stream without a time column, a daemon's, results written before it was kept)."""
    for run in runs:
        for row in run.series:
            value = row.get("chunk_time")
            if history_time(value) is not None:
                return "date-time" if isinstance(value, str) else "number"
    return None


def _time_column(runs: Sequence[RunLike]) -> str:
    """The runs' ``dataset.time_column`` (the first set), for the axis and note; "time" where none says."""
    names = (run.config.get("dataset", {}).get("time_column") for run in runs)
    return next((str(name) for name in names if name), "time")


Curve = tuple[list[int], list[float]]


def _mean_by_chunk(group: Sequence[RunLike], curve: Callable[[RunLike], Curve]) -> Curve:
    """The mean over a configuration's runs of ``curve`` at each chunk some run has a value for."""
    values: dict[int, list[float]] = defaultdict(list)
    for run in group:
        for t, y in zip(*curve(run), strict=True):
            values[t].append(y)
    ts = sorted(values)
    return ts, [_mean(values[t]) for t in ts]


@dataclasses.dataclass(frozen=True)
class _AgePanel:
    """A panel of the model age figure: each configuration's curve, the bound's policy key (None: no
    bound applies), the unit's size and name, its title."""

    curve: Callable[[list[RunLike]], Curve]
    bound_key: str | None
    scale: float
    unit: str
    title: str


def _row_curve(key: str) -> Callable[[list[RunLike]], Curve]:
    return lambda group: mean_curve(group, key)[:2]


def _age_panels(runs: Sequence[RunLike], in_time: bool) -> list[_AgePanel]:
    """The chunks panel, and a time panel: the history's (its rows' ``chunk_time``) where the runs
    replayed a history with a time column, else the runs' seconds where they are the stream's (``in_time``)."""
    panels = [
        _AgePanel(
            _row_curve("model_age_chunks"),
            "max_model_age_chunks",
            1.0,
            "chunks",
            "chunks since the last training stage",
        )
    ]
    kind = history_time_kind(runs)
    if kind is not None:
        column = _time_column(runs)
        if kind == "date-time":
            longest = max((age for run in runs for age in history_ages(run)[1]), default=0.0)
            scale, unit = _age_unit(longest)
        else:  # numbers: their own units, whatever they count
            scale, unit = 1.0, f"{column} units"
        title = f"time since the last training stage, in the history's time ({column})"
        # No bound: a backtest ignores policy.max_model_age_seconds (research/simulate.py, replayed).
        panels.append(_AgePanel(lambda group: _mean_by_chunk(group, history_ages), None, scale, unit, title))
    elif in_time:
        longest = max((row.get("model_age_seconds") or 0.0 for run in runs for row in run.series), default=0.0)
        scale, unit = _age_unit(longest)
        title = "time since the last training stage"
        panels.append(_AgePanel(_row_curve("model_age_seconds"), "max_model_age_seconds", scale, unit, title))
    return panels


def plot_model_age(runs: Sequence[RunLike], path: Path, *, in_time: bool = True) -> bool:
    """The model's age after each chunk: chunks (top) and time (bottom) since the last training stage,
    one curve per configuration (0 on a chunk that trained), each configuration's freshness bound
    (``policy.max_model_age_chunks`` / ``max_model_age_seconds``) a dashed line of its color where it
    falls within the curves' range (the note names the others). Over more than 50 chunks, each point
    is the oldest the model got in a block of chunks.

    The time is the history's where the rows carry their chunk's time (``chunk_time``: a backtest of a
    table with ``dataset.time_column``), in days, hours, minutes or seconds as the longest age fits
    (:func:`history_ages`; a time column of numbers in its own units). Else ``in_time`` says whether
    the rows' seconds are the stream's time (a daemon's, whose chunks arrive); a backtest's (False)
    are how fast this machine trained, so only the chunks panel is drawn, the note saying why. False,
    and nothing drawn, where no run recorded the model's age (results written before it was kept)."""
    if not any(row.get("model_age_chunks") is not None for run in runs for row in run.series):
        return False
    groups = configurations(runs)
    ordered = sorted(groups.items(), key=lambda item: _order_key(dict(item[0])))
    panels = _age_panels(runs, in_time)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(7.5, 1.2 + 2.7 * len(panels)), sharex=True, layout="constrained", squeeze=False
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # An age's sawtooth, its period the wait, is a solid band sooner than a measure's noise: blocks from
    # 50 chunks on (the oldest in each), so that the configurations' curves stay apart.
    size = block_size(runs, most=_MARKED_POINTS, blocks=_MARKED_POINTS)
    drawn_bounds, above = False, set()
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        top = 1.0
        curves: list[tuple[list[float], list[float]]] = []
        for i, (config, group) in enumerate(ordered):
            ts, ys = panel.curve(group)
            if not ts:
                continue
            xs, values, _ = in_blocks(ts, [y / panel.scale for y in ys], size, combine=max)
            # Policies of one schedule have one age at every width: a curve on top of an earlier one is
            # dashed, so that the earlier one's color shows through.
            same = curves.count((xs, values))
            curves.append((xs, values))
            ax.plot(
                xs,
                values,
                _DASHES[(i // len(colors) + same) % len(_DASHES)],
                marker="." if len(xs) <= _MARKED_POINTS else None,
                linewidth=1.2,
                color=colors[i % len(colors)],
                label=describe(dict(config)),
            )
            top = max(top, *values)
        for i, (_, group) in enumerate(ordered):
            if panel.bound_key is None:
                continue
            for bound in sorted({b for run in group if (b := run.config.get("policy", {}).get(panel.bound_key))}):
                # A day's bound over a simulation's seconds would flatten every curve: named in the note.
                if bound / panel.scale <= 5 * top:
                    ax.axhline(bound / panel.scale, linestyle=(0, (5, 3)), linewidth=1.0, color=colors[i % len(colors)])
                    drawn_bounds = True
                else:
                    above.add(f"policy.{panel.bound_key}={bound:g}")
        # A little below 0, so that the points of the chunks that trained are whole.
        ax.set_ylim(bottom=-0.04 * max(top, ax.get_ylim()[1]))
        ax.set_title(panel.title, fontsize=9)
        ax.set_ylabel(panel.unit)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0, 0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("mega-batches received")
    notes = ["dashed: the freshness bound, which forces a stage"] if drawn_bounds else []
    if above:
        notes.append(f"bound above the plot: {', '.join(sorted(above))}")
    if size > 1:
        notes.append(f"each point: the oldest the model got in {size} consecutive chunks")
    if history_time_kind(runs) is not None:
        notes.append(
            f"time: the history's column {_time_column(runs)!r}, each chunk at its newest row, from a run's first stage on"
        )
    elif not in_time:
        notes.append(REPLAYED_AGE)
    title = "Model age after each mega-batch"
    if varying_keys(runs):
        legend: str | None = _legend_title(list(groups.values()))
    else:  # one configuration: the title names it
        mean = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
        title, legend = f"{title}: {headline(runs[0])}{mean}", None
    _finish(fig, title, notes, legend, path)
    return True
