"""What a team's stage trains and validates on (the pooled validation set, the class-aware replay set),
the decision it leaves with the version, and a resumed engine that goes on as an uninterrupted one."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from alma_daemon.config import ConfigError, build_config
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.checkpoints import REPLAY, VALIDATION, CheckpointStore
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine_state import EngineState
from alma_daemon.core.records import timeless
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.data.task_terms import configured_task, with_target_terms
from alma_daemon.data.tensors import LabeledData

FRAUD_TASK = TaskInfo("classification", (6,), 2, normalization="standardize")
COST_TASK = {"classes": ["ok", "fraud"], "measure": "cost", "false_negative_cost": 20, "class_weights": [1, 20]}


def fraud_data(n: int, seed: int, share: float = 0.05) -> LabeledData:
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < share).long()
    x = torch.randn(n, 6, generator=g) * 2 + 10
    x[:, :2] += 3.0 * y.view(-1, 1)
    return LabeledData(x, y)


def engine_for(tmp_path, task: dict, stream: dict | None = None, state=None, epochs: int = 4):
    config = build_config(
        {
            "task": task,
            "stream": stream or {},
            "dataset": {"normalization": "standardize"},
            "train": {"epochs": epochs, "patience": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.01},
            "learner": {"width": 8},
            "policy": {"name": "fixed", "wait": 1},
            "device": "cpu",
        }
    )
    store = CheckpointStore(tmp_path, "model")
    task_info = configured_task(FRAUD_TASK, config)
    return assemble_engine(
        config, task_info, MemoryBuffer(), test_set=fraud_data(400, seed=99), checkpoints=store, state=state
    )


def chunks(count: int = 6, size: int = 400) -> list[Chunk]:
    return [Chunk(i, part) for i, part in enumerate(partition(fraud_data(size * count, seed=1), count, 0), start=1)]


def test_a_teams_stages_validate_on_the_pool_replay_a_stratified_sample_and_save_both(tmp_path):
    engine = engine_for(tmp_path, COST_TASK)
    assert (engine.recipe.keep, engine.recipe.validation_examples) == ("classes", 2000)
    stream = chunks()
    for chunk in stream:
        engine.on_chunk(chunk)
    pool, replay = engine.team.validation_pool, engine.team.replay_reservoir
    # Every chunk's held-out share stays in the pool (2,400 examples x 10 % < 2,000).
    assert pool is not None and len(pool) == sum(round(len(c.data) * 0.1) for c in stream)
    assert replay is not None and len(replay) == sum(len(c.data) for c in stream) - len(pool)
    saved = load_file(str(tmp_path / "model" / str(engine.state.model_version) / VALIDATION))
    assert torch.equal(saved["x"], pool.data.x) and tuple(saved["seen"].tolist()) == pool.seen
    assert (tmp_path / "model" / str(engine.state.model_version) / REPLAY).is_file()
    # A stage trains on its new chunk and as many replayed examples: the record counts both.
    last = engine.state.series[-1]
    assert last["epochs"] >= 1 and last["model_version"] == len(stream)


def test_the_cost_decision_is_chosen_after_each_stage_saved_with_the_version_and_measured_with(tmp_path):
    engine = engine_for(tmp_path, COST_TASK)
    for chunk in chunks():
        engine.on_chunk(chunk)
    task = engine.learner.task
    assert task.decision == "cost" and task.threshold == pytest.approx(1 / 21)
    assert task.calibration is not None
    version = engine.state.model_version
    spec = json.loads((tmp_path / "model" / str(version) / "spec.json").read_text())
    assert spec["task"]["threshold"] == pytest.approx(1 / 21)
    metrics = json.loads((tmp_path / "model" / str(version) / "metrics.json").read_text())
    assert metrics["threshold"] == pytest.approx(1 / 21)
    assert engine.state.series[-1]["threshold"] == pytest.approx(1 / 21)
    # The engine measures with the same decision the version serves: flagged where calibrated p >= 1/21.
    test = fraud_data(400, seed=99)
    outputs = engine.learner.outputs(test)
    flagged = outputs[:, 1] >= 1 / 21
    cost = float(((test.y == 1) & ~flagged).sum() * 20 + ((test.y == 0) & flagged).sum()) / len(test)
    assert engine.state.series[-1]["test_cost"] == pytest.approx(cost)


def test_a_resumed_engine_goes_on_with_the_reservoirs_and_decision_the_last_stage_left(tmp_path):
    stream = chunks()
    whole = engine_for(tmp_path / "whole", COST_TASK)
    for chunk in stream:
        whole.on_chunk(chunk)
    first = engine_for(tmp_path / "resumed", COST_TASK)
    for chunk in stream[:3]:
        first.on_chunk(chunk)
    state = EngineState(**json.loads(json.dumps(first.state.__dict__)))
    resumed = engine_for(tmp_path / "resumed", COST_TASK, state=state)
    assert torch.equal(resumed.team.validation_pool.data.x, first.team.validation_pool.data.x)
    assert torch.equal(resumed.team.replay_reservoir.ranks, first.team.replay_reservoir.ranks)
    assert resumed.learner.task.threshold == first.learner.task.threshold
    for chunk in stream[3:]:
        resumed.on_chunk(chunk)
    assert [timeless(r) for r in resumed.state.series] == [timeless(r) for r in whole.state.series]


def test_a_pool_too_small_to_stop_on_says_so_and_trains_every_epoch(tmp_path, caplog):
    engine = engine_for(tmp_path, COST_TASK, epochs=3)
    rare = LabeledData(fraud_data(300, seed=5, share=0.0).x, torch.zeros(300, dtype=torch.long))
    rare.y[:2] = 1
    with caplog.at_level(logging.WARNING, logger="alma_daemon.core.engine"):
        engine.on_chunk(Chunk(1, rare))
    (warning,) = [r.getMessage() for r in caplog.records if "too few to decide" in r.getMessage()]
    assert "holds 0 positives" in warning and "train.epochs=3" in warning
    row = engine.state.series[-1]
    assert row["epochs"] == 3 and row["best_epoch"] == 3


def test_the_old_recipe_and_the_papers_tasks_keep_no_reservoir(tmp_path):
    engine = engine_for(tmp_path, COST_TASK, stream={"replay": False, "validation_examples": 0})
    for chunk in chunks(2):
        engine.on_chunk(chunk)
    assert engine.team.validation_pool is None and engine.team.replay_reservoir is None
    paper = build_config({}).stream.recipe(MNIST_TASK.is_team_task)
    assert (paper.keep, paper.validation_examples) == ("none", 0)


def test_a_threshold_decision_on_more_than_two_classes_is_refused_naming_the_key():
    config = build_config({"task": {"decision": "recall", "decision_target": 0.9}})
    with pytest.raises(ConfigError, match=r"^task.decision: recall decides between two classes; this task has 10"):
        with_target_terms(MNIST_TASK, config.task)
    binary = with_target_terms(FRAUD_TASK, config.task)
    assert (binary.decision, binary.decision_target) == ("recall", 0.9)
    assert with_target_terms(FRAUD_TASK, build_config({"task": COST_TASK}).task).decision == "cost"
    assert with_target_terms(FRAUD_TASK, build_config({}).task).decision == ""


def test_a_backtest_that_never_fills_the_pooled_validation_set_says_so(tmp_path, caplog):
    engine = engine_for(tmp_path, COST_TASK)
    for chunk in chunks(2):
        engine.on_chunk(chunk)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="alma_daemon.core.engine"):
        engine.say_unfilled_pool()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("stream.validation_examples=2000 is more than the 80 examples this stream's 2 chunks")


def stage_examples(tmp_path, version: int) -> int:
    return json.loads((tmp_path / "model" / str(version) / "metrics.json").read_text())["examples"]


def changing_chunks(flip_at: int, count: int = 6, size: int = 400) -> list[Chunk]:
    """Chunks whose fraud rule moves to two other features from chunk ``flip_at`` on."""
    data = fraud_data(size * count, seed=4, share=0.2)
    moved = data.y.bool() & (torch.arange(len(data)) >= size * (flip_at - 1))
    data.x[moved, :2] -= 3.0
    data.x[moved, 2:4] += 3.0
    return [Chunk(i, data.subset(slice((i - 1) * size, i * size))) for i in range(1, count + 1)]


def said_changed(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the stream changed" in r.getMessage()]


def test_where_the_stream_changes_the_reservoirs_restart_from_the_new_chunks_and_say_so(tmp_path, caplog):
    engine = engine_for(tmp_path, COST_TASK, epochs=10)
    stream = changing_chunks(flip_at=4)
    with caplog.at_level(logging.WARNING, logger="alma_daemon.core.team_stage"):
        for chunk in stream[:3]:
            engine.on_chunk(chunk)
        assert not said_changed(caplog), "a still stream keeps its reservoirs"
        engine.on_chunk(stream[3])
    (said,) = said_changed(caplog)
    assert said.startswith("the stream changed: the served model's loss on the 400 new examples") and (
        "stream.reservoir_reset" in said
    )
    # The stage of the change trained and validated on its chunk alone, and both sets hold only that chunk.
    assert stage_examples(tmp_path, 4) == 400
    assert [row.get("restarted") for row in engine.state.series] == [None, None, None, True]
    assert len(engine.team.validation_pool) == 40 and len(engine.team.replay_reservoir) == 360
    # The next stage reads them again: its 360 new training examples, as many replayed, the pool's 80.
    engine.on_chunk(stream[4])
    assert stage_examples(tmp_path, 5) == 360 + 360 + 80


def test_with_reservoir_reset_off_a_changed_stream_keeps_its_reservoirs(tmp_path, caplog):
    engine = engine_for(tmp_path, COST_TASK, stream={"reservoir_reset": False}, epochs=10)
    with caplog.at_level(logging.WARNING, logger="alma_daemon.core.team_stage"):
        for chunk in changing_chunks(flip_at=4)[:4]:
            engine.on_chunk(chunk)
    assert not said_changed(caplog)
    assert len(engine.team.validation_pool) == 160 and stage_examples(tmp_path, 4) > 400


def test_a_stage_of_few_new_examples_is_topped_up_from_the_replay_set_to_stream_stage_examples(tmp_path):
    engine = engine_for(tmp_path, COST_TASK, stream={"stage_examples": 1000})
    for chunk in chunks(4):
        engine.on_chunk(chunk)
    # Stage 1 has nothing to replay; stage 2 tops its 360 new training examples up with the 360 the set
    # holds; stages 3 and 4 replay 640 of the 720 and 1,080 held, past the 360 they would match.
    validated = [40, 80, 120, 160]
    trained = [stage_examples(tmp_path, stage) - val for stage, val in enumerate(validated, start=1)]
    assert trained == [360, 720, 1000, 1000]
    assert engine.team.replayed_examples(360) == 640 and engine.team.replayed_examples(900) == 900


def test_stage_examples_without_a_class_aware_replay_set_or_beyond_it_is_refused_naming_the_key():
    config = build_config({"stream": {"stage_examples": 1000, "replay": False}})
    with pytest.raises(ConfigError, match=r"^stream\.stage_examples: set, but stages top up"):
        config.stream.recipe(team_task=True)
    with pytest.raises(ConfigError, match=r"^stream\.stage_examples: 5000 is more than the replay set holds"):
        build_config({"stream": {"stage_examples": 5000}})
    assert build_config({"stream": {"stage_examples": 4000}}).stream.recipe(team_task=True).stage_examples == 4000


def test_the_change_tests_predictions_count_in_the_stages_compute(tmp_path):
    checked = engine_for(tmp_path / "checked", COST_TASK, epochs=10)
    unchecked = engine_for(tmp_path / "unchecked", COST_TASK, stream={"reservoir_reset": False}, epochs=10)
    for chunk in chunks(3):
        checked.on_chunk(chunk)
        unchecked.on_chunk(chunk)
    flops = [[row["train_flops"] for row in engine.state.series] for engine in (checked, unchecked)]
    # Stage 3 scores the served model on its 400 new examples and the pool's 80 (stage 2's pool of 40
    # is too small to test); the training itself is the same, the stream being still.
    per_example = checked.learner.inference_flops_per_example()
    assert flops[0][:2] == flops[1][:2]
    assert flops[0][2] - flops[1][2] == int(480 * per_example) > 0
