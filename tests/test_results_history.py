"""The daemon's results files on an endless stream: results.json holds the newest rows, series.jsonl
and series.csv every row, appended, and cut back to the committed steps after a crash."""

from __future__ import annotations

import json

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.learners import build_learner
from alma_daemon.observability.results import HISTORY_FILE, ResultsWriter, read_results, truncate_rows_after
from policies import build_policy
from tests.helpers.data import separable_data


def engine_with(writer: ResultsWriter) -> Engine:
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}}, ["policy.wait=2"])
    learner = build_learner("sm", MNIST_TASK, config.learner, 0)
    return Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), observers=[writer])


def test_the_history_holds_every_row_while_results_json_holds_the_engines(tmp_path) -> None:
    writer = ResultsWriter(tmp_path, {}, history=True)
    engine = engine_with(writer)
    for i, part in enumerate(partition(separable_data(MNIST_TASK, 300, seed=1), 6, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
        del engine.state.series[:-2]  # as the daemon's store keeps the newest rows only
    written = json.loads((tmp_path / "results.json").read_text())
    # Written at the step, before the commit cuts the engine's rows back to two.
    assert [r["t"] for r in written["series"]] == [4, 5, 6] and written["series_file"] == HISTORY_FILE
    assert [r["t"] for r in read_results(tmp_path)["series"]] == [1, 2, 3, 4, 5, 6]
    csv_rows = (tmp_path / "series.csv").read_text().splitlines()
    assert csv_rows[0].startswith("t,chunk,") and [r.split(",")[0] for r in csv_rows[1:]] == list("123456")


def test_a_resumed_writer_cuts_the_rows_no_commit_kept_and_appends_after_them(tmp_path) -> None:
    history, csv = tmp_path / HISTORY_FILE, tmp_path / "series.csv"
    history.write_text("".join(json.dumps({"t": t}) + "\n" for t in (1, 2, 3)) + '{"t": 4, "tes')
    csv.write_text("t,chunk\n1,1\n2,2\n3,3\n4,")
    truncate_rows_after(history, 2)
    truncate_rows_after(csv, 2)
    assert history.read_text() == '{"t": 1}\n{"t": 2}\n'
    assert csv.read_text() == "t,chunk\n1,1\n2,2\n"
    truncate_rows_after(csv, 0)
    truncate_rows_after(history, 0)
    assert csv.read_text() == "t,chunk\n" and history.read_text() == ""


@pytest.mark.parametrize("rows", [1, 3000])
def test_cutting_reads_back_across_blocks(tmp_path, rows) -> None:
    history = tmp_path / HISTORY_FILE
    history.write_text("".join(json.dumps({"t": t, "pad": "x" * 40}) + "\n" for t in range(1, rows + 1)))
    truncate_rows_after(history, rows // 2)
    kept = [json.loads(line)["t"] for line in history.read_text().splitlines()]
    assert kept == list(range(1, rows // 2 + 1))


def test_a_torn_last_line_is_cut_even_when_it_reads_as_an_earlier_row(tmp_path) -> None:
    csv = tmp_path / "series.csv"
    csv.write_text("t,chunk\n56,56\n57,57\n5")  # row 58 cut after its first digit
    truncate_rows_after(csv, 57)
    assert csv.read_text() == "t,chunk\n56,56\n57,57\n"


def test_resume_gives_the_history_the_committed_rows_it_lacks_and_an_older_folder_its_series(tmp_path) -> None:
    writer = ResultsWriter(tmp_path, {}, history=True)
    engine = engine_with(writer)
    for i, part in enumerate(partition(separable_data(MNIST_TASK, 200, seed=1), 4, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
    rows = read_results(tmp_path)["series"]
    # The machine went down before rows 3 and 4 reached the disk, though their steps committed.
    truncate_rows_after(tmp_path / HISTORY_FILE, 2)
    ResultsWriter(tmp_path, {}, history=True).resume(engine)
    assert read_results(tmp_path)["series"] == rows

    # A folder an older daemon wrote: its whole series in results.json, a CSV of fewer columns.
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text(json.dumps({"series": rows, "summary": {}}))
    (old / "series.csv").write_text("t,chunk\n1,1\n2,2\n3,3\n4,4\n")
    ResultsWriter(old, {}, history=True).resume(engine)
    assert [json.loads(line) for line in (old / HISTORY_FILE).read_text().splitlines()] == rows
    lines = (old / "series.csv").read_text().splitlines()
    assert lines[0].startswith("t,chunk,examples_seen") and [line.split(",")[0] for line in lines[1:]] == list("1234")
