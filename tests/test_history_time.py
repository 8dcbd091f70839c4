"""A backtest in its history's own time (issue 52, item 3): each chunk of a table with a time column
carries the time of its newest row, its step records it as ``chunk_time`` (results.json and series.csv),
and ``alma report`` draws the model's age in that time, in the unit its longest age fits; a stream
without a time column keeps its model's age in chunks, and the daemon's rows (whose records carry no
time) have no ``chunk_time``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.figure
import pytest

from alma_daemon.config import build_config, to_dict
from alma_daemon.core.records import StepRecord, timeless
from alma_daemon.observability import figures
from alma_daemon.observability.figures import REPLAYED_AGE, history_ages
from alma_daemon.observability.report import AGE_PLOT, find_runs, write_report
from alma_daemon.research.simulate import run_simulation, simulated_stream
from tests.helpers.tables import history, table_config, write_csv

#: history(): one row an hour from 2024-03-01 00:00 (its ``step``), shuffled; 200 rows, the last 20 the
#: test set, so 3 chunks of 60 rows whose newest rows are steps 59, 119 and 179.
CHUNK_TIMES = ["2024-03-03T11:00:00+00:00", "2024-03-05T23:00:00+00:00", "2024-03-08T11:00:00+00:00"]


def chunk_times(config) -> list:
    return [chunk.time for chunk in simulated_stream(config).chunks]


def test_each_chunk_of_a_table_carries_the_time_of_its_newest_row(tmp_path):
    path = write_csv(tmp_path / "h.csv", history())
    assert chunk_times(table_config(path)) == CHUNK_TIMES
    # Numbers as written; a drift changes the examples, not their time.
    assert chunk_times(table_config(path, time_column="step")) == [59, 119, 179]
    drifting = build_config(
        {**to_dict(table_config(path)), "stream": {"megabatches": 3, "drift": {"kind": "permute_labels", "at": 2}}}
    )
    assert chunk_times(drifting) == CHUNK_TIMES
    # No time column: the files' order, and no time.
    assert chunk_times(table_config(path, time_column=None, feature_columns=["f0", "f1"])) == [None] * 3


def test_a_date_time_with_a_zone_is_carried_in_utc(tmp_path):
    columns = {
        "when": [f"2024-03-01T{h:02d}:30:00+02:00" for h in range(10)],
        "f": list(range(10)),
        "label": [0, 1] * 5,
    }
    config = table_config(
        write_csv(tmp_path / "h.csv", columns), megabatches=2, task={"classes": []}, test_fraction=0.2
    )
    assert chunk_times(config) == ["2024-03-01T01:30:00+00:00", "2024-03-01T05:30:00+00:00"]  # 03:30 and 07:30 at +02


def test_a_step_row_has_chunk_time_only_when_its_chunk_had_one_and_timeless_leaves_it_out():
    base = {"t": 1, "chunk": 1, "examples_seen": 5, "decision": "wait", "reason": "r", "test": 0.5,
            "prequential": 0.5, "cumulative_prequential": 0.5, "cumulative": 0.5, "train_flops": 0,
            "cumulative_train_flops": 0, "parameters": 1, "cumulative_parameters": 1,
            "inference_flops_per_example": 1.0, "train_seconds": 0.0, "cumulative_train_seconds": 0.0,
            "model_version": 0, "wall_seconds": 0.1, "measure": "error"}  # fmt: skip
    timed = StepRecord(**base, chunk_time=CHUNK_TIMES[0]).as_row()
    assert list(timed)[:4] == ["t", "chunk", "examples_seen", "chunk_time"] and timed["chunk_time"] == CHUNK_TIMES[0]
    assert StepRecord.from_row(timed).chunk_time == CHUNK_TIMES[0]
    untimed = StepRecord(**base).as_row()
    assert "chunk_time" not in untimed and StepRecord.from_row(untimed).chunk_time is None
    # The daemon replaying a table has no chunk_time (its records carry no time): the same step otherwise.
    assert timeless(timed) == timeless(untimed)


def test_a_backtest_records_each_chunks_time_and_its_report_draws_the_age_in_that_time(tmp_path, monkeypatch):
    path = write_csv(tmp_path / "h.csv", history(rows=250))  # 225 rows stream: 5 chunks of 45 hours
    settings = to_dict(table_config(path, megabatches=5))
    config = build_config(
        settings
        | {
            "learner": {"name": "sm", "width": 4},
            "train": {"epochs": 1, "patience": 0},
            "policy": {"name": "fixed", "wait": 2},
        }
    )
    run = tmp_path / "run"
    series = run_simulation(config, run, progress=False)["series"]
    # The newest rows of the chunks are steps 44, 89, 134, 179 and 224.
    expected = ["2024-03-02T20:00:00+00:00", "2024-03-04T17:00:00+00:00", "2024-03-06T14:00:00+00:00",
                "2024-03-08T11:00:00+00:00", "2024-03-10T08:00:00+00:00"]  # fmt: skip
    assert [row["chunk_time"] for row in series] == expected
    assert json.loads((run / "results.json").read_text())["series"] == series
    with (run / "series.csv").open(newline="") as f:
        assert [row["chunk_time"] for row in csv.DictReader(f)] == expected
    # Wait 2 trains on chunks 2 and 4: the model is 45 hours old after chunks 3 and 5, and has no age in
    # the history's time before its first stage.
    (found,) = find_runs(run)
    assert [row["trained"] for row in series] == [False, True, False, True, False]
    assert history_ages(found) == ([2, 3, 4, 5], [0.0, 45 * 3600.0, 0.0, 45 * 3600.0])

    drawn: dict[str, matplotlib.figure.Figure] = {}
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, path, *a, **k: drawn.setdefault(Path(path).name, fig)
    )
    close = figures.plt.close
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: None)
    try:
        write_report(run, tmp_path / "report")
        age = drawn[AGE_PLOT[0]]
        assert [ax.get_ylabel() for ax in age.axes] == ["chunks", "hours"]  # under 2 days: in hours
        assert "in the history's time (when)" in age.axes[1].get_title()
        assert "history's column 'when'" in age.get_supxlabel() and REPLAYED_AGE not in age.get_supxlabel()
        (line,) = [line for line in age.axes[1].get_lines() if not line.get_label().startswith("_")]
        assert list(line.get_xdata()) == [2, 3, 4, 5]
        assert list(line.get_ydata()) == pytest.approx([0.0, 45.0, 0.0, 45.0])
    finally:
        for fig in drawn.values():
            close(fig)
