"""Every figure of ``alma report`` reads, from a backtest of 10 chunks to one of 2,000, of 1 run to 12:
tick labels that say distinct numbers without running into each other, a legend entry per
configuration (one line each), axis ranges that hold the data (or mark what they cut), the baseline
on every panel of the task's measure, windows named by what they hold, the model's age in a time only
where the stream has one: a backtest's in its history's time (each row's ``chunk_time``), a daemon's in
the time its chunks arrived. Results are built row by row (tests/helpers/report_runs.py): nothing trains."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import matplotlib.figure
import pytest

from alma_daemon.core.records import StepRecord
from alma_daemon.observability import figures
from alma_daemon.observability.figures import REPLAYED_AGE, describe, plot_model_age
from alma_daemon.observability.report import AGE_PLOT, draw_plots, find_runs, plot_cer_vs, plot_replay
from alma_daemon.observability.report_policies import policy_section
from alma_daemon.observability.results import HISTORY_FILE
from alma_daemon.observability.ticks import distinct_labels, log_ticks
from tests.helpers.report_runs import STREAMED_DAYS, rows, synthetic_runs, write_runs

#: A log axis's labels: plain numbers with an SI suffix (``3.5G``), never ``3.5e9`` nor ``10^9``.
PLAIN_NUMBER = re.compile(r"^\d+(\.\d+)?[kMGTP]?$")


@pytest.fixture
def drawn(monkeypatch) -> Iterator[dict[str, matplotlib.figure.Figure]]:
    """The figures the report saves, by file name, drawn but not written (the checks read the figures;
    tests/test_report_html.py reads the files), kept open to be looked at."""
    kept: dict[str, matplotlib.figure.Figure] = {}

    def savefig(fig, path, *args, **kwargs):
        kept[Path(path).name] = fig
        fig.canvas.draw()  # lays the figure out as saving it would

    close = figures.plt.close
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: None)
    yield kept
    for fig in kept.values():
        close(fig)


@functools.cache
def backtest(chunks: int, runs: int) -> list:
    """:func:`synthetic_runs`, built once per test process (2,000 chunks of 12 runs take a while)."""
    return synthetic_runs(chunks, runs)


def report(tmp_path: Path, drawn: dict, chunks: int, runs: int) -> dict[str, matplotlib.figure.Figure]:
    """Every figure ``alma report`` draws of a backtest of ``runs`` runs of ``chunks`` chunks (as
    :func:`write_report` draws them, without reading and writing files), by file name."""
    for fig in drawn.values():
        figures.plt.close(fig)
    drawn.clear()
    runs_of = backtest(chunks, runs)
    draw_plots(runs_of, tmp_path)
    assert plot_model_age(runs_of, tmp_path / AGE_PLOT[0], in_time=False)
    policy_section(runs_of, tmp_path)
    return dict(drawn)


def tick_labels(axis) -> list:
    """The axis's major tick labels a reader sees: within the view, not empty."""
    low, high = sorted(axis.get_view_interval())
    ticks = [tick for tick in axis.get_major_ticks() if low <= tick.get_loc() <= high]
    return [tick.label1 for tick in ticks if tick.label1.get_visible() and tick.label1.get_text()]


def overlap(a, b) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def check_ticks(name: str, fig) -> None:
    """On every axis: tick labels that say distinct things and do not overlap."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = tick_labels(axis)
            texts = [label.get_text() for label in labels]
            assert len(set(texts)) == len(texts), f"{name}: repeated tick labels {texts}"
            boxes = [label.get_window_extent(renderer) for label in labels]
            for (i, a), (j, b) in combinations(enumerate(boxes), 2):
                assert not overlap(a, b), f"{name}: tick labels {texts[i]!r} and {texts[j]!r} overlap"
            # An axis whose labels are hidden shares them with the panel under it.
            if axis.get_scale() == "log" and texts:
                assert len(texts) >= 2 and all(PLAIN_NUMBER.match(t) for t in texts), f"{name}: log labels {texts}"


def check_title(name: str, fig) -> None:
    """The title, however long, clear of the legend beside the axes."""
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    for legend in fig.legends:
        assert not overlap(title, legend.get_window_extent(renderer)), f"{name}: the title runs into the legend"


def check_ranges(name: str, fig) -> None:
    """Every point of every line within its axes' range, or a triangle on the edge it is beyond."""
    for ax in fig.axes:
        (left, right), (bottom, top) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        lines = ax.get_lines()
        edges = {
            (float(x), float(y)) for line in lines if line.get_marker() in ("^", "v") for x, y in line.get_xydata()
        }
        for line in lines:
            for x, y in line.get_xydata():
                assert left <= x <= right, f"{name}: x={x} outside {left, right}"
                if not bottom - 1e-9 <= y <= top + 1e-9:
                    assert (float(x), top if y > top else bottom) in edges, f"{name}: y={y} cut without a mark"


def legend_texts(fig) -> list[str]:
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def configurations_of(runs) -> list[str]:
    return sorted(describe(dict(config)) for config in figures.configurations(runs))


@pytest.mark.parametrize(("chunks", "runs"), [(10, 1), (10, 3), (2000, 12)])
def test_every_figure_of_a_report_reads(tmp_path, drawn, chunks, runs):
    shown = report(tmp_path, drawn, chunks, runs)
    expected = {"error_vs_time.png", "measures_vs_time.png", "reliability.png", "model_age.png"}
    if runs > 1:
        expected |= {"cer_vs_flops.png", "cer_vs_parameters.png", "policies.png", "policies-served.png"}
    assert expected <= set(shown)
    for name, fig in shown.items():
        check_ticks(name, fig)
        check_title(name, fig)
        check_ranges(name, fig)

    # A legend entry per configuration; a single one is named in the title instead.
    synthetic = backtest(chunks, runs)
    for name in ("error_vs_time.png", "measures_vs_time.png", "reliability.png", "model_age.png"):
        if runs == 1:
            assert not shown[name].legends and "policy=adaptive" in shown[name].get_suptitle()
        else:
            assert sorted(legend_texts(shown[name])) == configurations_of(synthetic), name

    # The baseline, dashed, on every panel of the task's measure (its prequential panel is the team's bill).
    curves = shown["error_vs_time.png"]
    for ax in curves.axes:
        baselines = [line for line in ax.get_lines() if line.get_gid() == "baseline"]
        assert len(baselines) == 1, ax.get_title()  # every configuration's is the same: one grey line
        assert list(baselines[0].get_ydata()) == pytest.approx([0.585] * len(baselines[0].get_ydata()))
        assert baselines[0].get_linestyle() == "--"
    window = curves.axes[-1].get_title()
    assert ("every chunk so far" in window) == (chunks <= 50) and ("last 50 chunks" in window) == (chunks > 50)

    # A backtest's seconds are how fast the machine trained: its model's age is in chunks and in the
    # history's time (its rows' chunk_time), in the unit its longest age fits, with no bound of seconds.
    age = shown["model_age.png"]
    unit = {10: "days", 2000: "minutes"}[chunks]
    assert [ax.get_ylabel() for ax in age.axes] == ["chunks", unit]
    assert "history's column 'when'" in age.get_supxlabel() and REPLAYED_AGE not in age.get_supxlabel()
    assert "in the history's time (when)" in age.axes[1].get_title()

    # 2,000 chunks are drawn as 100 blocks of 20, each a mean, and the model's age (a sawtooth that
    # fills a panel sooner) as 50 blocks of 40, each the oldest, as the notes say.
    if chunks == 2000:
        assert {len(line.get_xdata()) for line in curves.axes[0].get_lines() if line.get_gid() is None} == {100}
        assert "each point: the mean over 20 consecutive chunks" in curves.get_supxlabel()
        assert "the oldest the model got in 40 consecutive chunks" in age.get_supxlabel()


def test_a_cer_line_joins_the_waits_of_one_policy_not_different_policies(tmp_path, drawn):
    runs = backtest(10, 12)
    for key, name in (("cumulative_train_flops", "flops.png"), ("cumulative_parameters", "parameters.png")):
        assert plot_cer_vs(runs, key, key, tmp_path / name)
        labels = legend_texts(drawn[name])
        assert labels == [
            "sm width=8 policy=adaptive",
            "sm width=8 policy=fixed",
            "sm width=16 policy=adaptive",
            "sm width=16 policy=fixed",
        ]
        (ax,) = drawn[name].axes
        points = {line.get_label(): len(line.get_xdata()) for line in ax.get_lines() if line.get_label() in labels}
        assert points == dict.fromkeys(labels[1::2], 2) | dict.fromkeys(labels[::2], 1)  # fixed: wait=1 and 4
        assert "joining its wait" in drawn[name].get_supxlabel()


def test_the_replay_figure_reads(tmp_path, drawn):
    runs = synthetic_runs(10, 3)  # changed below: not the cached ones
    for replay, run in zip((False, True, False), runs, strict=True):
        run.config["stream"]["replay"] = replay
    twins = [run for run in runs if run.config["policy"]["name"] == "fixed"]
    for run in twins:  # one configuration run without and with replay
        run.config["policy"]["wait"] = 1
    assert plot_replay(twins, tmp_path / "replay.png")
    check_ticks("replay.png", drawn["replay.png"])
    check_ranges("replay.png", drawn["replay.png"])


def age_curves(ax) -> dict[str, list[float]]:
    """The model age figure's curves on ``ax``, by configuration."""
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_a_backtests_model_age_is_drawn_in_its_historys_time(tmp_path, drawn):
    """Equal chunks of a 54-day history are 5.4 days each: each configuration's age in days is its age
    in chunks times 5.4, 0 on a chunk that trained."""
    runs = synthetic_runs(10, 3)
    assert plot_model_age(runs, tmp_path / "age.png", in_time=False)
    (fig,) = drawn.values()
    chunks, days = fig.axes
    assert [chunks.get_ylabel(), days.get_ylabel()] == ["chunks", "days"]
    in_chunks, in_days = age_curves(chunks), age_curves(days)
    assert sorted(in_days) == sorted(in_chunks) == configurations_of(runs)
    per_chunk = STREAMED_DAYS / 10
    for name, ages in in_chunks.items():
        assert in_days[name] == pytest.approx([age * per_chunk for age in ages]), name
    assert max(in_days["sm policy=fixed wait=4"]) == pytest.approx(3 * per_chunk)
    check_ticks("age.png", fig)
    check_ranges("age.png", fig)


def test_a_history_whose_time_is_numbers_is_drawn_in_its_own_units(tmp_path, drawn):
    runs = synthetic_runs(10, 1)
    for row in runs[0].series:
        row["chunk_time"] = 100 * row["t"]  # a step counter, say: no unit to convert to
    assert plot_model_age(runs, tmp_path / "age.png", in_time=False)
    (fig,) = drawn.values()
    assert [ax.get_ylabel() for ax in fig.axes] == ["chunks", "when units"]
    ((_, in_chunks),), ((_, in_when),) = (age_curves(ax).items() for ax in fig.axes)
    assert in_when == [100 * age for age in in_chunks] and max(in_when) > 0


def test_a_backtest_without_a_time_column_is_drawn_in_chunks_saying_why(tmp_path, drawn):
    runs = synthetic_runs(10, 3, history_time=False)
    assert plot_model_age(runs, tmp_path / "age.png", in_time=False)
    (fig,) = drawn.values()
    assert [ax.get_ylabel() for ax in fig.axes] == ["chunks"] and REPLAYED_AGE in fig.get_supxlabel()


def test_a_daemons_model_age_is_drawn_in_its_streams_time(tmp_path, drawn):
    runs = synthetic_runs(10, 3, arrival_times=True)
    assert plot_model_age(runs, tmp_path / "age.png", in_time=True)
    (fig,) = drawn.values()
    assert [ax.get_ylabel() for ax in fig.axes] == ["chunks", "seconds"]
    assert REPLAYED_AGE not in fig.get_supxlabel()


def test_a_daemons_folder_says_its_chunks_arrived_in_time(tmp_path):
    """A daemon keeps its series in the history file; a backtest's folder has none."""
    write_runs(tmp_path / "backtest", 4, 1)
    write_runs(tmp_path / "daemon", 4, 1)
    for folder in (tmp_path / "daemon").iterdir():
        (folder / HISTORY_FILE).touch()
    assert [run.arrival_times for run in find_runs(tmp_path)] == [False, True]


@pytest.mark.parametrize(
    ("low", "high", "labels"),
    [
        (3.4e9, 3.7e9, ["3.4G", "3.5G", "3.6G", "3.7G"]),  # the fraud policies' FLOPs: never "3.5e9, 3.5e9"
        (6.5e9, 1.8e10, ["7.5G", "10G", "12.5G", "15G", "17.5G"]),
        (9e11, 7e12, ["1T", "2T", "5T"]),
        (3e-4, 1.3, ["0.001", "0.01", "0.1", "1"]),
        (1.0, 1e12, ["1", "100", "10k", "1M", "100M", "10G", "1T"]),
    ],
)
def test_log_ticks_are_a_few_plain_numbers_each_written_exactly(low, high, labels):
    assert distinct_labels(log_ticks(low, high)) == labels


def test_the_synthetic_rows_are_rows_of_results():
    """The figures' tests read rows as results.json holds them: each reads back as a step record."""
    for row in rows(8, {"name": "fixed", "wait": 4}, 6, 0):
        assert StepRecord.from_row(row).measure == "cost"
