"""A team's own history (``dataset.name: table``) from CSV, Parquet or npz: read in time order, cut into
contiguous chunks, its last share the test set; its columns and labels checked at start-up; and the
same task and test set for ``alma simulate``, ``alma grid``, ``alma replay`` and the daemon."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from alma_daemon.config import ConfigError, DatasetConfig, build_config, load_config, to_dict
from alma_daemon.data.datasets import DatasetError, dataset_names, load_dataset
from alma_daemon.data.stream_task import TASK_READERS, load_stream_task
from alma_daemon.data.table import read_table
from alma_daemon.data.tensors import LabeledData
from alma_daemon.research.grid import load_grid, run_grid
from alma_daemon.research.simulate import STREAM_KINDS, run_simulation, simulated_stream
from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES, close_redis, connect_redis
from alma_daemon.transports.replay import CHUNK_SOURCES, labeled_chunks
from examples.table import make_transactions
from tests.helpers.daemon import PROCESS_LIMIT_SECONDS, REPO, engine_state, exact
from tests.helpers.tables import FEATURES, ROWS, history, table_config, write_csv


def steps(data: LabeledData) -> list[int]:
    """The ``step`` feature (the row's time) of each example."""
    return data.x[:, 0].long().tolist()


def test_a_csv_history_is_put_in_time_order_and_its_last_tenth_is_the_test_set(tmp_path):
    table = read_table(table_config(write_csv(tmp_path / "h.csv", history())))
    assert steps(table.train) == list(range(180)) and steps(table.test) == list(range(180, 200))
    assert table.task.input_shape == (FEATURES,) and table.task.extra["features"] == ["step", "f0", "f1", "f2"]
    assert (table.task.kind, table.task.num_classes, table.task.normalization) == ("classification", 2, "standardize")
    assert table.train.x.dtype == torch.float32 and table.train.y.dtype == torch.int64


def test_label_names_map_to_the_indexes_of_task_classes(tmp_path):
    columns = history()
    table = read_table(table_config(write_csv(tmp_path / "h.csv", columns), task={"classes": ["fraud", "ok"]}))
    order = np.argsort(columns["step"])
    expected = [0 if columns["label"][i] == "fraud" else 1 for i in order]
    assert (table.train.y.tolist() + table.test.y.tolist()) == expected
    assert 0 < expected.count(0) < ROWS / 5  # rare, as fraud is


def test_the_simulated_chunks_are_contiguous_in_time_and_drop_no_row_between_them(tmp_path):
    stream = simulated_stream(table_config(write_csv(tmp_path / "h.csv", history())))
    assert [steps(chunk.data) for chunk in stream.chunks] == [list(range(i * 60, (i + 1) * 60)) for i in range(3)]


def test_rows_of_one_time_keep_the_order_of_the_files_and_files_are_concatenated(tmp_path):
    first = write_csv(tmp_path / "a.csv", {"when": [2, 1, 2], "v": [10, 11, 12], "label": [0, 1, 0]})
    second = write_csv(tmp_path / "b.csv", {"when": [1, 2], "v": [13, 14], "label": [1, 1]})
    table = read_table(table_config([first, second], task={"classes": []}, test_fraction=0.2))
    assert table.train.x[:, 0].tolist() + table.test.x[:, 0].tolist() == [11, 13, 10, 12, 14]


def test_a_parquet_history_reads_as_the_same_csv_does(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install -e '.[table]'")
    import pyarrow.parquet as pq

    columns = history()
    parquet = tmp_path / "h.parquet"
    arrow = {**columns, "when": pa.array(np.array(columns["when"], dtype="datetime64[s]"))}
    pq.write_table(pa.table(arrow), parquet)
    from_csv = read_table(table_config(write_csv(tmp_path / "h.csv", columns)))
    from_parquet = read_table(table_config(parquet))
    assert from_parquet.task == from_csv.task
    for a, b in ((from_parquet.train, from_csv.train), (from_parquet.test, from_csv.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_an_npz_history_is_ordered_by_its_array_t(tmp_path):
    t = np.array([3, 0, 2, 1, 4, 5, 9, 8, 7, 6])
    np.savez(tmp_path / "h.npz", x=np.stack([t, -t], axis=1).astype(np.float64), y=t % 2, t=t)
    config = build_config({"dataset": {"name": "table", "files": str(tmp_path / "h.npz"), "test_fraction": 0.2}})
    table = read_table(config)
    assert table.train.x[:, 0].tolist() == list(range(8)) and table.test.y.tolist() == [0, 1]
    assert table.task.extra["features"] == ["x0", "x1"]


def test_a_separate_test_file_is_the_test_set_and_the_whole_history_streams(tmp_path):
    columns = history()
    test = {key: values[:30] for key, values in history(seed=1).items()}
    config = table_config(write_csv(tmp_path / "h.csv", columns), test_file=str(write_csv(tmp_path / "t.csv", test)))
    table = read_table(config)
    assert (len(table.train), len(table.test)) == (ROWS, 30)


def test_a_regression_target_is_read_as_float_numbers(tmp_path):
    columns = {"when": [1, 2, 3, 4, 5], "a": [1, 2, 3, 4, 5], "label": [0.5, 1.5, 2.5, 3.5, 4.25]}
    path = write_csv(tmp_path / "h.csv", columns)
    for task in ({"kind": "regression"}, {"measure": "mae"}):
        table = read_table(table_config(path, task={"classes": [], **task}, test_fraction=0.2))
        assert (table.task.kind, table.task.num_classes) == ("regression", 1)
        assert table.train.y.dtype == torch.float32 and table.test.y.tolist() == [4.25]


def test_a_regression_table_simulates_judged_by_its_measure(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3)).round(3)
    columns = {"when": list(range(120)), **{f"f{i}": list(x[:, i]) for i in range(3)}, "label": list(x[:, 0] * 2 + 5)}
    config = table_config(write_csv(tmp_path / "h.csv", columns), task={"classes": [], "measure": "mae"})
    config = build_config(
        {**to_dict(config), "learner": {"name": "sm", "width": 4}, "train": {"epochs": 1, "patience": 0}}
    )
    summary = run_simulation(config, tmp_path / "run", progress=False)["summary"]
    assert (summary["measure"], summary["chunks"]) == ("mae", 3)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["series"][-1]["test_mae"] >= 0


@pytest.mark.parametrize(
    ("change", "dataset", "task", "message"),
    [
        ({}, {"label_column": "target"}, {}, "dataset.label_column: no column 'target' in h.csv"),
        ({}, {"time_column": "ts"}, {}, "dataset.time_column: no column 'ts' in h.csv"),
        ({}, {"feature_columns": ["f0", "f9"]}, {}, "dataset.feature_columns: no column 'f9' in h.csv"),
        (
            {},
            {"feature_columns": ["f0", "merchant"]},
            {},
            "dataset.feature_columns: column 'merchant' of h.csv is not numeric ('zeta' in data row 1)",
        ),
        (
            {"f1": 5},
            {},
            {},
            "dataset.missing: h.csv has 1 missing or non-finite feature cells (first: column 'f1', data row 6)",
        ),
        ({}, {}, {"classes": []}, "dataset.label_column: column 'label' of h.csv holds class names ('fraud', 'ok')"),
        (
            {},
            {},
            {"classes": ["ok", "frod"]},
            "dataset.label_column: 'fraud' in column 'label' of h.csv is not among task.classes (ok, frod)",
        ),
        ({"when": 7}, {}, {}, "dataset.time_column: column 'when' of h.csv holds 'soon'"),
    ],
)
def test_a_column_or_label_that_does_not_fit_is_refused_in_one_line_naming_key_and_column(
    tmp_path, change, dataset, task, message
):
    columns = history()
    for name, row in change.items():
        columns[name][row] = "soon" if name == "when" else ""
    config = table_config(write_csv(tmp_path / "h.csv", columns), task=task, **dataset)
    with pytest.raises(DatasetError) as refusal:
        read_table(config)
    assert str(refusal.value).startswith(message) and "\n" not in str(refusal.value)


def test_integer_labels_outside_the_declared_classes_or_not_integers_are_refused(tmp_path):
    path = write_csv(tmp_path / "h.csv", {"when": [1, 2, 3], "a": [1, 2, 3], "label": [0, 1, 2]})
    with pytest.raises(DatasetError, match="label 2 in h.csv is outside the 2 classes of task.classes"):
        read_table(table_config(path))
    path = write_csv(tmp_path / "h.csv", {"when": [1, 2, 3], "a": [1, 2, 3], "label": [0, 1.5, 1]})
    with pytest.raises(DatasetError, match="holds 1.5 .data row 2., not a class index"):
        read_table(table_config(path, task={"classes": []}))


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"name": "table", "label_column": "y"}, "dataset.files: dataset.name=table needs"),
        ({"name": "table", "files": "h.csv"}, "dataset.label_column: name the label column"),
        ({"name": "mnist", "time_column": "t"}, "dataset.time_column: read only by dataset.name=table"),
        ({"name": "table", "files": "h.npz", "label_column": "y"}, "dataset.label_column: an .npz table holds"),
        (
            {"name": "table", "files": "h.csv", "label_column": "y", "test_file": "t.csv", "test_fraction": 0.2},
            "dataset.test_fraction: dataset.test_file is the test set",
        ),
        ({"name": "table", "files": "h.csv", "label_column": "y", "feature_columns": ["y"]}, "'y' is dataset.label"),
        ({"name": "table", "files": "h.xlsx", "label_column": "y"}, None),
    ],
)
def test_the_config_refuses_a_table_it_cannot_read_before_anything_is_read(dataset, message):
    if message is None:  # a file ending no reader takes: refused when the stream is built
        with pytest.raises(ConfigError, match="dataset.files: h.xlsx is not a table"):
            read_table(build_config({"dataset": dataset}))
        return
    with pytest.raises(ConfigError, match=message):
        build_config({"dataset": dataset})


def test_the_daemons_task_reader_gives_the_simulators_task_and_test_set(tmp_path):
    config = table_config(write_csv(tmp_path / "h.csv", history()), task={"measure": "recall"}, test_examples=15)
    read, simulated = load_stream_task(config), simulated_stream(config)
    assert read.task == simulated.task and read.task.measure == "recall" and read.task.classes == ("ok", "fraud")
    assert read.test is not None and simulated.test is not None and len(read.test) == 15
    assert torch.equal(read.test.x, simulated.test.x) and torch.equal(read.test.y, simulated.test.y)


def test_alma_replay_sends_the_simulators_chunks(tmp_path):
    config = table_config(write_csv(tmp_path / "h.csv", history()))
    replayed = list(CHUNK_SOURCES["table"](config))
    simulated = list(simulated_stream(config).chunks)
    assert [c.chunk_id for c in replayed] == [c.index for c in simulated] == [1, 2, 3]
    for sent, chunk in zip(replayed, simulated):
        assert torch.equal(sent.tensors["x"], chunk.data.x) and torch.equal(sent.tensors["y"], chunk.data.y)


def test_simulated_arrays_are_the_chunks_alma_replay_npz_sends_measured_on_the_test_file(tmp_path):
    rng = np.random.default_rng(0)
    for name, rows in (("train", 120), ("test", 30)):
        np.savez(tmp_path / f"{name}.npz", x=rng.normal(size=(rows, 5)).astype(np.float32), y=rng.integers(0, 3, rows))
    dataset = {"name": "arrays", "input_shape": [5], "num_classes": 3, "test_file": str(tmp_path / "test.npz")}
    config = build_config({"dataset": {**dataset, "files": str(tmp_path / "train.npz")}, "stream": {"megabatches": 4}})
    stream = simulated_stream(config)
    assert stream.test is not None and len(stream.test) == 30 and stream.task == load_stream_task(config).task
    with np.load(tmp_path / "train.npz") as arrays:
        sent = labeled_chunks(LabeledData(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])), config)
        for replayed, chunk in zip(sent, stream.chunks, strict=True):
            assert torch.equal(replayed.tensors["x"], chunk.data.x) and torch.equal(replayed.tensors["y"], chunk.data.y)
    with pytest.raises(
        ConfigError, match="dataset.files: alma simulate with dataset.name=arrays needs .* dataset.name: table"
    ):
        simulated_stream(build_config({"dataset": dataset}))


def test_every_dataset_the_config_names_has_a_stream_and_a_task_reader():
    names = typing.get_args(typing.get_type_hints(DatasetConfig)["name"])
    for name in names:
        assert name in STREAM_KINDS or name in dataset_names(), name
        assert name in TASK_READERS or name in dataset_names(), name
    with pytest.raises(
        DatasetError, match="unknown dataset 'imagenet'; known: arrays, cifar10, mnist, ptb, river, table, text$"
    ):
        load_dataset("imagenet")


@pytest.mark.slow
def test_the_example_history_reads_as_its_config_says(tmp_path):
    path = tmp_path / "transactions.csv"
    make_transactions.write_csv(path, make_transactions.transactions())
    config = load_config(REPO / "examples" / "table" / "fraud.yaml", [f"dataset.files={path}"])
    table = read_table(config)
    assert table.task.input_shape == (30,) and table.task.extra["features"][0] == "f00"
    assert (len(table.train), len(table.test)) == (36_000, 4_000)
    assert 0.015 < float(table.train.y.float().mean()) < 0.03
    runs = load_grid(REPO / "examples" / "table" / "fraud-policies.yaml")
    names = ["policy=fixed_1", "policy=fixed_5", "policy=adaptive", "policy=adaptive_500", "policy=forecast"]
    assert [run.name for run, _ in runs] == names
    assert all(config.dataset.name == "table" for _, config in runs)


@pytest.mark.slow
def test_a_grid_of_policies_over_a_table_writes_each_runs_results(tmp_path):
    path = write_csv(tmp_path / "h.csv", history(rows=400))
    base = {
        "dataset": {"name": "table", "files": str(path), "label_column": "label", "time_column": "when"},
        "task": {"classes": ["ok", "fraud"], "measure": "recall"},
        "stream": {"megabatches": 3},
        "learner": {"name": "sm", "width": 8},
        "train": {"epochs": 2, "patience": 1},
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    grid = {"base": "base.yaml", "grid": {"policy": [{"name": "fixed", "wait": 1}, {"name": "fixed", "wait": 2}]}}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    status = run_grid(tmp_path / "grid.yaml", tmp_path / "runs", progress=False)
    assert [run["status"] for run in status["runs"]] == ["ok", "ok"]
    for run in status["runs"]:
        results = json.loads((Path(run["folder"]) / "results.json").read_text())
        assert results["summary"]["chunks"] == 3 and results["summary"]["measure"] == "recall"
        assert [step["chunk"] for step in results["series"]] == [1, 2, 3]
    assert [r["summary"]["stages"] for r in status["runs"]] == [3, 1]


@pytest.mark.integration
@pytest.mark.slow
def test_the_daemon_replaying_a_table_commits_the_simulators_series(tmp_path):
    path = write_csv(tmp_path / "h.csv", history(rows=300))
    settings = {
        "dataset": {"name": "table", "files": str(path), "label_column": "label", "time_column": "when"},
        "task": {"classes": ["ok", "fraud"], "measure": "recall"},
        "stream": {"megabatches": 3},
        "learner": {"name": "sm", "width": 8},
        "train": {"epochs": 2, "patience": 1},
        "daemon": {"stream": "history", "state_dir": str(tmp_path / "state"), "poll_seconds": 0.2},
    }
    config_path = tmp_path / "history.yaml"
    config_path.write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "alma_daemon"]
    for args in (
        ["simulate", "--config", str(config_path), "--out", str(tmp_path / "simulated"), "--no-progress"],
        [
            "run",
            "--embedded",
            "--replay",
            "table",
            "--until-chunks",
            "3",
            "--config",
            str(config_path),
            "--no-progress",
        ],
    ):
        done = subprocess.run(command + args, cwd=REPO, capture_output=True, timeout=PROCESS_LIMIT_SECONDS)
        assert done.returncode == 0, done.stderr.decode()
    simulated = json.loads((tmp_path / "simulated" / "results.json").read_text())["series"]
    client = connect_redis(build_config(settings, EMBEDDED_OVERRIDES))
    try:
        committed = engine_state(client, "history")["series"]
    finally:
        close_redis(client)
    assert len(committed) == len(simulated) == 3
    # A measure without a value (the precision of a model that flags nothing) is null in results.json
    # and NaN in Redis: the same absence.
    assert without_nan(exact(committed)) == without_nan(exact(simulated))


def without_nan(value: typing.Any) -> typing.Any:
    """``value`` with every NaN (nested in lists and dicts) as None."""
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nan(item) for item in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def with_missing_cells(columns: dict[str, list], cells: dict[int, str], name: str = "f1") -> dict[str, list]:
    """``columns`` with column ``name``'s cells at the given rows replaced."""
    for row, value in cells.items():
        columns[name][row] = value
    return columns


def test_a_column_of_numbers_with_a_text_cell_is_refused_naming_the_cell_not_dropped(tmp_path):
    """The silent loss of a feature (issue 52): a numeric column with "n/a" cells used to be left out."""
    path = write_csv(tmp_path / "h.csv", with_missing_cells(history(), {7: "n/a", 30: "n/a"}))
    with pytest.raises(DatasetError) as refusal:
        read_table(table_config(path))
    assert str(refusal.value).startswith(
        "dataset.missing: column 'f1' of h.csv holds 'n/a' in data row 8 (2 of 200 cells are not numbers); "
        "set dataset.missing: drop or fill"
    )


def test_dataset_missing_drop_leaves_out_the_rows_and_counts_them_in_the_summary(tmp_path):
    columns = with_missing_cells(history(), {7: "n/a", 30: "", 31: "nan"})
    config = table_config(write_csv(tmp_path / "h.csv", columns), missing="drop")
    table = read_table(config)
    assert len(table.train) + len(table.test) == ROWS - 3 and table.rows_dropped == 3
    assert torch.isfinite(table.train.x).all() and torch.isfinite(table.test.x).all()
    summary = run_simulation(config, tmp_path / "run", progress=False)["summary"]
    assert summary["rows_dropped"] == 3 and summary["text_columns"] == ["merchant"]
    assert summary["rows_in_no_chunk"] == len(table.train) % 3
    written = json.loads((tmp_path / "run" / "results.json").read_text())["summary"]
    assert written["rows_dropped"] == 3


def test_dataset_missing_fill_gives_the_cells_its_value_and_keeps_every_row(tmp_path):
    columns = with_missing_cells(history(), {7: "n/a", 30: ""})
    table = read_table(table_config(write_csv(tmp_path / "h.csv", columns), missing="fill", fill_value=-9.0))
    x = torch.cat([table.train.x, table.test.x])
    assert len(x) == ROWS and table.rows_dropped == 0
    assert int((x[:, 2] == -9.0).sum()) == 2  # f1 is the third feature: step, f0, f1, f2


def test_a_text_column_left_out_of_the_features_is_said(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="alma_daemon.data.table"):
        table = read_table(table_config(write_csv(tmp_path / "h.csv", history())))
    assert table.text_columns == ("merchant",) and table.task.extra["features"] == ["step", "f0", "f1", "f2"]
    assert "the features leave out 'merchant' of h.csv" in caplog.text


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"missing": "fill"}, "dataset.fill_value: dataset.missing: fill takes the number"),
        ({"fill_value": 0.0}, "dataset.missing: dataset.missing: fill takes the number"),
    ],
)
def test_a_fill_needs_its_value_and_a_value_needs_the_fill(tmp_path, dataset, message):
    with pytest.raises(ConfigError, match=message):
        table_config(tmp_path / "h.csv", **dataset)


@pytest.mark.parametrize("dataset", [{"missing": "drop"}, {"fill_value": 0.0}])
def test_the_missing_cells_policy_is_read_only_by_a_table(dataset):
    key = next(iter(dataset))
    with pytest.raises(ConfigError, match=f"dataset.{key}: read only by dataset.name=table"):
        build_config({"dataset": {"name": "mnist", **dataset}})
