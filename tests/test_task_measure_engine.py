"""A team's task through the engine: its measure drives the records, the cumulative measure and the
policy; its feature statistics come from config; the paper's default rows keep their keys."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.records import read_rows
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData

#: A fraud-like task: 6 float features, class 1 rare.
FRAUD_TASK = TaskInfo("classification", (6,), 2, normalization="standardize")


def fraud_data(n: int, seed: int) -> LabeledData:
    """5 % positives, told apart by two of the six features (learnable, not perfectly)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.05).long()
    x = torch.randn(n, 6, generator=g) * 2 + 10
    x[:, :2] += 3.0 * y.view(-1, 1)
    return LabeledData(x, y)


def run_stream(task_section: dict, chunks: int = 6, policy: str = "adaptive", stream: dict | None = None):
    config = build_config(
        {
            "task": task_section,
            "stream": stream or {},
            "dataset": {"normalization": "standardize"},
            "train": {"epochs": 20, "patience": 3, "batch_size": 64, "optimizer": "adam", "lr": 0.01},
            "learner": {"width": 8},
            "policy": {"name": policy},
            "device": "cpu",
        }
    )
    task = configured_task(FRAUD_TASK, config)
    engine = assemble_engine(config, task, MemoryBuffer(), test_set=fraud_data(400, seed=99))
    for i, part in enumerate(partition(fraud_data(300 * chunks, seed=1), chunks, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
    return engine


def test_a_stream_judged_by_recall_records_recall_its_sum_its_baseline_and_the_other_measures():
    engine = run_stream({"classes": ["ok", "fraud"], "measure": "recall", "class_weights": [1, 19]})
    rows = engine.state.series
    assert {"test_recall", "prequential_recall", "cumulative_recall", "baseline_recall", "test_measures"} <= set(
        rows[-1]
    )
    assert not {"test_error", "cumulative_error"} & set(rows[-1])
    assert set(rows[-1]["test_measures"]) == {"error", "recall", "precision", "pr_auc"} - {"recall"}
    assert rows[-1]["baseline_recall"] == 0.0  # the majority class flags no fraud
    records = read_rows(rows)
    assert records[-1].cumulative == pytest.approx(sum(r.test for r in records))
    # Weighted as the team trained, the model finds frauds, and its alerts beat the fraud rate.
    assert records[-1].test > 0.3 and rows[-1]["test_measures"]["precision"] > 0.1
    assert all("live model recall" in r.reason for r in records)


def test_a_fall_of_recall_is_a_drift_to_the_policy():
    # Unweighted, the first stage learns to flag nothing: its recall falls from 1 to 0, 10 standard errors.
    # (The stage's own validation slice lets it stop at that epoch; a pooled set too small to stop on trains on.)
    old_recipe = {"replay": False, "validation_examples": 0}
    records = read_rows(run_stream({"classes": ["ok", "fraud"], "measure": "recall"}, stream=old_recipe).state.series)
    assert any(r.reason.startswith("drift: the newest chunk's recall 0.000 is 1 below") for r in records)


def test_the_cost_measure_drives_the_stages_and_its_standard_error_comes_from_the_costs_spread():
    engine = run_stream({"measure": "cost", "false_negative_cost": 20}, policy="adaptive")
    records = read_rows(engine.state.series)
    assert records[0].measure == "cost" and records[0].prequential > 0
    state = engine.policy.state_dict()
    assert state["live"].get("variance_total", 0) > 0 or state["previous"].get("variance_total", 0) > 0


def test_feature_statistics_from_a_file_are_the_models_before_any_chunk(tmp_path):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"mean": [10.0] * 6, "std": [2.0] * 6}))
    task = configured_task(
        FRAUD_TASK, build_config({"dataset": {"normalization": "standardize"}, "task": {"statistics_file": str(stats)}})
    )
    assert task.mean == (10.0,) * 6 and not task.awaits_statistics
    engine = run_stream({"statistics_file": str(stats)}, chunks=2)
    assert engine.learner.task.mean == (10.0,) * 6, "the first chunk did not replace the team's statistics"


def test_the_paper_tasks_rows_have_no_keys_of_a_teams_task():
    engine = run_stream({}, chunks=2)
    rows = engine.state.series
    # FRAUD_TASK is binary: it records its baseline and details; a 10-class task with the default measure would not.
    assert "baseline_error" in rows[-1] and "test_measures" in rows[-1]
    multiclass = replace(FRAUD_TASK, num_classes=3)
    config = build_config(
        {"dataset": {"normalization": "standardize"}, "learner": {"width": 8}, "train": {"epochs": 1}}
    )
    engine = assemble_engine(config, multiclass, MemoryBuffer(), test_set=fraud_data(50, seed=3))
    row = engine.state.series if engine.on_chunk(Chunk(1, fraud_data(60, seed=4))) else []
    assert not {"baseline_error", "test_measures", "prequential_measures"} & set(row[-1])


def test_a_measure_of_another_kind_of_task_is_refused_at_start_up_in_one_line():
    from alma_daemon.config import ConfigError
    from alma_daemon.data.datasets import MNIST_TASK

    config = build_config({"task": {"measure": "recall"}})
    with pytest.raises(ConfigError, match=r"^task.measure: measure 'recall' does not fit a multiclass task; it takes "):
        assemble_engine(config, configured_task(MNIST_TASK, config), MemoryBuffer())
