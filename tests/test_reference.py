"""The reference learner (reference.kind, alma_daemon/core/reference.py): River's linear model of the task's
kind, measured before it learns each chunk; its JSON state; its refusals; and where it shows: the engine's
records, a simulated run's summary, alma report, alma status and the metrics."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from alma_daemon import metrics
from alma_daemon.cli import main
from alma_daemon.config import ConfigError, build_config
from alma_daemon.core import reference_fit
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine_state import EngineState
from alma_daemon.core.records import StepRecord, read_rows
from alma_daemon.core.reference import ReferenceLearner, build_reference
from alma_daemon.core.reference_fit import AUTO_MAX_FEATURES, resolved_kind
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.data.tensors import LabeledData
from alma_daemon.observability.exporter import MetricsObserver
from alma_daemon.observability.report import write_report
from alma_daemon.research.simulate import run_simulation
from alma_daemon.service.status import measure_rows, reference_window
from tests.helpers.data import TINY_IMAGE_TASK

pytest.importorskip("river", reason="River is not installed: pip install -e '.[river]'")

BINARY = TaskInfo("classification", (6,), 2, normalization="standardize", class_weights=(1.0, 4.0))
MULTICLASS = TaskInfo("classification", (6,), 4, normalization="standardize")
REGRESSION = TaskInfo("regression", (6,), 1, normalization="standardize")
TASKS = {"binary": BINARY, "multiclass": MULTICLASS, "regression": REGRESSION}


def table(task: TaskInfo, n: int, seed: int) -> LabeledData:
    """Six features in unlike units, a linear score of them deciding the target (with noise)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.5, 3.0, 20.0, 1.0, 100.0, 7.0])
    z = torch.randn(n, 6, generator=g)
    x = z * scale + torch.arange(6.0)
    score = z @ torch.tensor([1.5, -1.0, 0.5, 0.0, 1.0, -0.5]) + 0.3 * torch.randn(n, generator=g)
    if task.regression:
        return LabeledData(x, (50.0 * score + 200.0).float())
    if task.num_classes == 2:
        return LabeledData(x, (score > 1.0).long())
    logits = z @ torch.tensor([[1.5, -1.0, 0.0, 0.5], [-1.0, 1.0, 0.5, 0.0], [0.0, 0.5, -1.5, 1.0]] * 2)
    return LabeledData(x, (logits + 0.3 * torch.randn(n, 4, generator=g)).argmax(1))


# -- the learner ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", TASKS)
def test_each_kind_of_task_gets_rivers_linear_model_which_learns_the_stream(kind):
    task = TASKS[kind]
    reference = ReferenceLearner(task)
    assert (
        reference.description
        == {
            "binary": "StandardScaler | LogisticRegression",
            "multiclass": "StandardScaler | OneVsRestClassifier(LogisticRegression)",
            "regression": "StandardScaler | LinearRegression",
        }[kind]
    )
    held_out = table(task, 500, seed=9)
    outputs = reference.outputs(held_out.x)
    # Class probabilities N x C (uniform before any class was met), or a regression's predictions N.
    assert outputs.shape == ((500,) if task.regression else (500, task.num_classes))
    if not task.regression:
        assert torch.allclose(outputs.sum(1), torch.ones(500, dtype=torch.float64))
    before = reference.assess(held_out)
    reference.learn(table(task, 3000, seed=1))
    after = reference.assess(held_out)
    assert reference.examples == 3000
    assert after < 0.5 * before  # error, or mse: lower is better
    if kind == "binary":
        assert after < 0.15  # weighted 1:4, it flags more than the error rate alone would


@pytest.mark.parametrize("kind", TASKS)
def test_a_reference_rebuilt_from_its_json_predicts_and_keeps_learning_exactly_as_the_original(kind):
    task = TASKS[kind]
    original = ReferenceLearner(task)
    original.learn(table(task, 1500, seed=1))
    state = json.loads(json.dumps(original.state_dict()))  # as Redis holds it
    rebuilt = build_reference("linear", task, state)
    assert rebuilt is not None
    later = table(task, 700, seed=2)
    assert torch.equal(rebuilt.outputs(later.x), original.outputs(later.x))
    original.learn(later)
    rebuilt.learn(later)
    assert json.dumps(rebuilt.state_dict()) == json.dumps(original.state_dict())
    assert rebuilt.assess(table(task, 300, seed=3)) == original.assess(table(task, 300, seed=3))


def test_a_saved_reference_of_another_task_is_refused():
    state = ReferenceLearner(BINARY).state_dict()
    with pytest.raises(ValueError, match="the saved reference is of version, task kind and features"):
        ReferenceLearner(MULTICLASS).load_state_dict(state)


# -- which reference, and what is refused ----------------------------------------------------------------
TEXT_TASK = TaskInfo("language_model", (64,), 100)


def test_auto_is_linear_on_flat_features_and_none_on_images_text_and_wide_features():
    assert resolved_kind("auto", BINARY) == "linear"
    assert resolved_kind("auto", dataclasses.replace(BINARY, input_shape=(AUTO_MAX_FEATURES,))) == "linear"
    wide = dataclasses.replace(BINARY, input_shape=(AUTO_MAX_FEATURES + 1,))
    for task in (MNIST_TASK, TINY_IMAGE_TASK, TEXT_TASK, wide):
        assert resolved_kind("auto", task) == "none"
        assert build_reference("auto", task) is None
    assert resolved_kind("linear", wide) == "linear"  # asked for, it runs (a microsecond per feature and example)
    assert build_reference("none", BINARY) is None


@pytest.mark.parametrize(
    ("task", "words"),
    [
        (MNIST_TASK, "needs flat numeric features (one axis); this task's examples are 28x28 (images or arrays)"),
        (TEXT_TASK, "has no model for a language model's tokens"),
    ],
)
def test_linear_on_images_or_text_is_refused_at_start_up_in_one_line_naming_the_key(task, words):
    config = build_config({"reference": {"kind": "linear"}, "dataset": {"name": "river"}, "device": "cpu"})
    with pytest.raises(ConfigError) as caught:
        assemble_engine(config, task, MemoryBuffer())
    message = str(caught.value)
    assert message.startswith(f"reference.kind: linear {words}") and "\n" not in message
    assert message.endswith("set reference.kind: auto or none")


def test_linear_without_river_is_refused_and_auto_has_none(monkeypatch):
    monkeypatch.setattr(reference_fit, "river_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"^reference.kind: linear needs River: pip install 'alma-daemon\[river\]'"):
        build_reference("linear", BINARY)
    assert build_reference("auto", BINARY) is None


@pytest.mark.parametrize(
    ("dataset", "streams"),
    [
        ({"name": "mnist"}, "images"),
        ({"name": "ptb"}, "text"),
        ({"name": "arrays", "input_shape": [8, 8], "num_classes": 4}, "arrays of shape [8, 8]"),
    ],
)
def test_the_config_refuses_linear_where_the_dataset_says_its_examples_are_not_flat(dataset, streams):
    with pytest.raises(ConfigError) as caught:
        build_config({"reference": {"kind": "linear"}, "dataset": dataset})
    assert str(caught.value) == (
        f"reference.kind: linear needs flat numeric features, and dataset.name={dataset['name']} streams {streams}; "
        "set reference.kind: auto or none"
    )
    build_config({"reference": {"kind": "auto"}, "dataset": dataset})  # auto has none there


def test_config_check_refuses_linear_without_river(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("dataset:\n  name: river\nreference:\n  kind: linear\n")
    assert main(["config", "check", str(path)]) == 0
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "river" else find_spec(name, *a))
    assert main(["config", "check", str(path)]) != 0
    assert "reference.kind: linear needs River" in capsys.readouterr().err


def test_state_and_rows_written_before_the_reference_still_load():
    old_state = {"chunks_seen": 3, "recent_prequential": [0.2]}
    state = EngineState(**old_state)
    assert (state.reference, state.cumulative_reference, state.recent_reference) == (None, 0.0, [])
    record = StepRecord.from_row(
        {
            "t": 1,
            "chunk": 1,
            "examples_seen": 10,
            "trained": False,
            "decision": "wait",
            "reason": "",
            "test_error": None,
            "prequential_error": 0.5,
            "cumulative_prequential_error": 0.5,
            "cumulative_error": None,
            "train_flops": 0,
            "cumulative_train_flops": 0,
            "parameters": 10,
            "cumulative_parameters": 10,
            "inference_flops_per_example": 1.0,
            "train_seconds": 0.0,
            "cumulative_train_seconds": 0.0,
            "model_version": 0,
            "wall_seconds": 1.0,
        }
    )
    assert (record.reference, record.cumulative_reference, record.reference_window) == (None, None, None)
    assert not any("reference" in key for key in record.as_row())


# -- the engine ---------------------------------------------------------------------------------------
def engine_for(task: TaskInfo, **sections: dict):
    config = build_config(
        {
            "dataset": {"normalization": "standardize"} if task.input_shape == (6,) else {},
            "train": {"epochs": 2, "batch_size": 64},
            "learner": {"width": 8},
            "stream": {"prequential_window": 2, "prequential_examples": 200},
            "device": "cpu",
            **sections,
        }
    )
    return config, assemble_engine(config, task, MemoryBuffer())


def chunks(task: TaskInfo, count: int) -> list[Chunk]:
    return [Chunk(i, part) for i, part in enumerate(partition(table(task, 300 * count, seed=1), count, seed=0), 1)]


def test_a_tables_records_carry_the_references_measure_on_the_networks_sample_then_it_learns_the_chunk():
    config, engine = engine_for(BINARY)
    stream = chunks(BINARY, 3)
    for chunk in stream:
        engine.on_chunk(chunk)
    rows = engine.state.series
    # The same reference, by hand: measured on the network's prequential sample, then taught the whole chunk.
    from alma_daemon.data.streams import prequential_sample

    by_hand, expected = ReferenceLearner(BINARY), []
    for chunk in stream:
        expected.append(by_hand.assess(prequential_sample(chunk, 200, config.stream.seed)))
        by_hand.learn(chunk.data)
    assert [row["reference_error"] for row in rows] == expected
    assert rows[-1]["cumulative_reference_error"] == pytest.approx(sum(expected))
    assert rows[-1]["reference_window_error"] == pytest.approx(sum(expected[-2:]) / 2)
    assert engine.state.reference == by_hand.state_dict() and engine.state.reference["examples"] == 900
    assert [r.reference for r in read_rows(rows)] == expected


def test_a_resumed_engine_rebuilds_its_reference_from_the_states_json():
    sections = {"policy": {"name": "fixed", "wait": 50}}  # no stage: a resumed engine needs no checkpoint
    stream = chunks(BINARY, 4)
    _, straight = engine_for(BINARY, **sections)
    for chunk in stream:
        straight.on_chunk(chunk)
    config, first = engine_for(BINARY, **sections)
    for chunk in stream[:2]:
        first.on_chunk(chunk)
    saved = json.loads(json.dumps(dataclasses.asdict(first.state)))
    resumed = assemble_engine(config, BINARY, MemoryBuffer(), state=EngineState(**saved))
    for chunk in stream[2:]:
        resumed.on_chunk(chunk)
    keys = ("reference_error", "cumulative_reference_error", "reference_window_error")
    assert [[row[k] for k in keys] for row in resumed.state.series] == [
        [row[k] for k in keys] for row in straight.state.series
    ]


def test_an_image_stream_has_no_reference_and_its_rows_no_reference_keys():
    from tests.helpers.data import separable_data

    images = TaskInfo("classification", (8, 8), 4, mean=(0.5,), std=(0.25,))
    _, engine = engine_for(images)
    assert engine.reference is None
    engine.on_chunk(Chunk(1, separable_data(images, 100)))
    assert not any("reference" in key for key in engine.state.series[-1])
    assert engine.state.reference is None


# -- where it shows -------------------------------------------------------------------------------------
def test_a_simulated_river_run_shows_the_reference_in_its_summary_report_status_and_metrics(tmp_path):
    config = build_config(
        {
            "dataset": {"name": "river", "river_stream": "sea", "river_examples": 900},
            "stream": {"megabatches": 4, "seed": 0},
            "learner": {"width": 8},
            "train": {"epochs": 2},
            "policy": {"name": "fixed", "wait": 1},
            "device": "cpu",
        }
    )
    results = run_simulation(config, tmp_path / "run", progress=False)
    rows, summary = results["series"], results["summary"]
    references = [row["reference_error"] for row in rows]
    assert len(references) == 4 and all(0 <= r <= 1 for r in references)
    assert summary["cumulative_reference_error"] == pytest.approx(sum(references))
    assert summary["served_reference_error"] == pytest.approx(sum(references[2:]) / 2)

    report = write_report(tmp_path / "run").read_text()
    assert "| served error | served error, reference |" in report
    assert "a network that does no better is behind a linear model" in report

    last = StepRecord.from_row(rows[-1])
    MetricsObserver.show(last)
    sample = metrics.REGISTRY.get_sample_value
    assert sample("alma_reference_prequential_measure", {"measure": "error"}) == last.reference
    assert sample("alma_reference_prequential_window_measure", {"measure": "error"}) == last.reference_window


def test_alma_status_says_whether_the_network_is_behind_the_reference():
    row = {
        "t": 5,
        "chunk": 5,
        "examples_seen": 500,
        "trained": False,
        "decision": "wait",
        "reason": "",
        "test_recall": None,
        "prequential_recall": 0.5,
        "cumulative_prequential_recall": 2.0,
        "prequential_window_recall": 0.55,
        "cumulative_recall": None,
        "reference_recall": 0.7,
        "cumulative_reference_recall": 3.0,
        "reference_window_recall": 0.65,
        "train_flops": 0,
        "cumulative_train_flops": 0,
        "parameters": 10,
        "cumulative_parameters": 50,
        "inference_flops_per_example": 1.0,
        "train_seconds": 0.0,
        "cumulative_train_seconds": 0.0,
        "model_version": 1,
        "wall_seconds": 1.0,
    }
    engine = {"recent_reference": [0.6, 0.7], "recent_prequential": [0.6, 0.5]}
    behind = reference_window(engine, StepRecord.from_row(row))
    assert behind == {"chunks": 2, "mean": 0.65, "network": 0.55, "behind": True}  # recall: higher is better
    measure = {"name": "recall", "test": None, "prequential": 0.5, "cumulative": None, "baseline": None, "details": {}}
    status = {"measure": measure, "prequential_window": {"chunks": 2, "mean": 0.55}, "reference": behind}
    rows = dict(measure_rows(status))
    assert rows["reference (linear)"] == "last 2 chunks 0.6500, the network's 0.5500: behind the reference"
    ahead = reference_window(engine, StepRecord.from_row({**row, "prequential_window_recall": 0.8}))
    assert ahead is not None and not ahead["behind"]
    assert reference_window(engine, StepRecord.from_row({**row, "reference_window_recall": None})) is None
