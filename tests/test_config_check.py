"""``alma config check`` refuses what start-up refuses (issue 52): every config below is refused by both
front doors' start-up (simulate's and the daemon's) for a reason its data does not decide, and by
``alma config check`` in the same line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from alma_daemon.cli import main
from alma_daemon.config import ConfigError, load_config
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.data.datasets import DatasetError
from alma_daemon.data.stream_task import load_stream_task
from alma_daemon.research.simulate import build_engine, simulated_stream
from alma_daemon.service.bootstrap import stream_schema

MNIST = {"dataset": {"name": "mnist"}}


def table(label: str = "classes", **terms) -> dict:
    """A config of the small history :func:`write_history` writes, with ``terms`` merged in."""
    config = {
        "dataset": {"name": "table", "files": "HISTORY", "label_column": label, "time_column": "t"},
        "task": {"classes": ["ok", "fraud"]} if label == "classes" else {"measure": "mse"},
        "stream": {"megabatches": 2},
    }
    for section, values in terms.items():
        config[section] = {**config.get(section, {}), **values}
    return config


#: (config, the line both refuse it with).
REFUSED = [
    (
        {**MNIST, "task": {"false_negative_cost": 5}},
        "task.false_negative_cost: costs are read only by task.measure: cost; set it, or unset the costs",
    ),
    (
        {**MNIST, "task": {"measure": "pr_auc"}},
        "task.measure: measure 'pr_auc' does not fit a multiclass task; it takes balanced_error, error, log_loss",
    ),
    (
        {**MNIST, "task": {"positive_class": "3"}},
        "task.positive_class: only a binary task has a positive class (this one has 10 classes)",
    ),
    (
        {**MNIST, "task": {"kind": "regression"}},
        "task.kind: the dataset's task is a classification (its labels say so); it cannot be read as a regression",
    ),
    (
        {**MNIST, "stream": {"features": ["a", "b", "c"], "chunk_examples": 100}},
        "stream.features: 3 names, but one example of mnist has shape (28, 28); name one field per input value",
    ),
    (
        table(task={"class_weights": [1, 2, 3]}),
        "task.class_weights: 3 given for the task's 2 classes",
    ),
    (
        table(dataset={"feature_columns": ["a", "b"]}, stream={"drift": {"kind": "rotate", "at": 2}}),
        "stream.drift.kind: rotate needs images (height x width [x channels]); inputs have shape [2]",
    ),
    (
        table("target", stream={"drift": {"kind": "permute_labels", "at": 2}}),
        "stream.drift.kind: permute_labels needs labeled examples; this stream is a regression",
    ),
    (
        table(dataset={"feature_columns": ["a", "b"]}, task={"feature_mean": [0.0], "feature_std": [1.0]}),
        "task.feature_mean: 1 means and 1 standard deviations for 2 features (input_shape [2])",
    ),
    (
        table(dataset={"feature_columns": ["a", "b"]}, task={"measure": "perplexity"}),
        "task.measure: measure 'perplexity' does not fit a binary task; it takes balanced_error, cost, error, "
        "log_loss, pr_auc, precision, recall",
    ),
]


def write_history(folder: Path) -> Path:
    """Twelve rows: a time, two features, class names and a number to predict."""
    path = folder / "history.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t", "a", "b", "classes", "target"])
        for row in range(12):
            writer.writerow([row, row * 0.5, (row % 3) - 1, "fraud" if row % 4 == 0 else "ok", row * 1.5])
    return path


def written(config: dict, folder: Path) -> Path:
    history = write_history(folder)
    if config["dataset"].get("files") == "HISTORY":
        config = {**config, "dataset": {**config["dataset"], "files": str(history)}}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def simulate_start_up(path: Path) -> None:
    config = load_config(str(path))
    build_engine(config, simulated_stream(config), [])


def daemon_start_up(path: Path) -> None:
    config = load_config(str(path))
    stream = load_stream_task(config)
    assemble_engine(config, stream.task, MemoryBuffer())
    stream_schema(stream.task, config)


@pytest.mark.parametrize(("config", "line"), REFUSED, ids=[line.split(":")[0] for _, line in REFUSED])
def test_config_check_refuses_what_start_up_refuses_in_the_same_line(config, line, tmp_path, capsys):
    path = written(config, tmp_path)
    for start_up in (simulate_start_up, daemon_start_up):
        with pytest.raises(ConfigError) as refusal:
            start_up(path)
        assert str(refusal.value) == line, start_up.__name__
    assert main(["config", "check", str(path)]) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"alma config check: config error: {line}"


def test_a_valid_team_config_is_valid_for_both(tmp_path, capsys):
    path = written(table(task={"measure": "cost", "false_negative_cost": 20}), tmp_path)
    simulate_start_up(path)
    assert main(["config", "check", str(path)]) == 0
    assert "valid" in capsys.readouterr().out


def test_a_measure_that_makes_class_names_a_regression_is_blamed_not_the_label_column(tmp_path):
    path = written(table(task={"classes": [], "measure": "mse"}), tmp_path)
    with pytest.raises(DatasetError, match=r"^task.measure: mse judges a regression, but column 'classes' of "):
        simulate_start_up(path)
