"""The engine (Algorithm 1): when it trains, on what, and the CER / compute arithmetic."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.atomic_json import finite
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.learners import build_learner
from alma_daemon.observability.results import ResultsWriter, read_results, results_of, summarize
from policies import build_policy
from tests.helpers.configs import config_for_any_learner
from tests.helpers.data import separable_data

B = 6


def run_stream(overrides: list[str], observers=(), chunks: int = B):
    config = config_for_any_learner(
        {"train": {"epochs": 2, "patience": 1, "batch_size": 64}, "learner": {"width": 8, "members": 2}}, overrides
    )
    data = separable_data(MNIST_TASK, 60 * chunks, seed=1)
    test = separable_data(MNIST_TASK, 100, seed=2)
    learner = build_learner(config.learner.name, MNIST_TASK, config.learner, config.seed)
    engine = Engine(
        learner,
        build_policy(config.policy),
        MemoryBuffer(),
        config,
        torch.device("cpu"),
        test_set=test,
        observers=list(observers),
    )
    for i, part in enumerate(partition(data, chunks, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
    return engine


class StageSpy(EngineObserver):
    def __init__(self):
        self.stages = []

    def on_stage(self, stage, engine):
        self.stages.append(stage)


@pytest.mark.parametrize("wait,trained_at", [(1, [1, 2, 3, 4, 5, 6]), (3, [3, 6]), (B, [B])])
def test_training_happens_every_wait_chunks(wait, trained_at):
    engine = run_stream([f"policy.wait={wait}"])
    assert [r["t"] for r in engine.state.series if r["trained"]] == trained_at
    assert engine.state.stages_done == len(trained_at)


@pytest.mark.parametrize("replay", [False, True])
def test_each_stage_trains_on_the_waited_chunks_or_on_everything_with_replay(replay):
    spy = StageSpy()
    run_stream(["policy.wait=2", f"stream.replay={str(replay).lower()}"], observers=[spy])
    assert [s.chunks for s in spy.stages] == [[1, 2], [3, 4], [5, 6]]
    per_chunk = 60
    expected = [2 * per_chunk * k for k in (1, 2, 3)] if replay else [2 * per_chunk] * 3
    assert [s.examples for s in spy.stages] == expected


def test_growth_compute_is_charged_to_the_stage_it_precedes():
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"name": "gmoe", "width": 8}})
    learner = build_learner("gmoe", MNIST_TASK, config.learner, 0)
    fitted = []
    fit = learner.fit
    learner.fit = lambda *args: fitted.append(fit(*args)) or fitted[-1]
    spy = StageSpy()
    engine = Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), observers=[spy])
    for i, part in enumerate(partition(separable_data(MNIST_TASK, 180, seed=1), 3, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
    growth_flops = [stage.growth.flops or 0 for stage in spy.stages]
    assert growth_flops[0] == 0 and all(f > 0 for f in growth_flops[1:])  # nothing to split before training
    assert [s.train_flops for s in spy.stages] == [r.flops + g for r, g in zip(fitted, growth_flops)]


def test_prequential_measure_can_be_taken_on_a_seeded_sample_of_each_chunk():
    whole = run_stream(["policy.wait=2"]).state.series
    sampled = run_stream(["policy.wait=2", "stream.prequential_examples=15"]).state.series
    again = run_stream(["policy.wait=2", "stream.prequential_examples=15"]).state.series
    assert [r["prequential_error"] for r in sampled] == [r["prequential_error"] for r in again]
    assert [r["prequential_error"] * 15 % 1 for r in sampled] == pytest.approx([0] * B, abs=1e-9)  # k of 15
    assert [r["prequential_error"] for r in sampled] != [r["prequential_error"] for r in whole]
    # Sampling is evaluation only: training and the test error are those of the whole-chunk run.
    assert [r["test_error"] for r in sampled] == [r["test_error"] for r in whole]


def test_cer_is_the_running_sum_of_test_errors_and_compute_adds_up():
    series = run_stream(["policy.wait=2"]).state.series
    running = 0.0
    for record in series:
        running += record["test_error"]
        assert record["cumulative_error"] == pytest.approx(running)
    assert sum(r["train_flops"] for r in series) == series[-1]["cumulative_train_flops"] > 0
    assert sum(r["parameters"] for r in series) == series[-1]["cumulative_parameters"]
    assert all(r["train_flops"] == 0 for r in series if not r["trained"])


def test_before_the_first_stage_the_error_is_the_fresh_models():
    series = run_stream([f"policy.wait={B}"]).state.series
    untrained = {r["test_error"] for r in series[:-1]}
    assert len(untrained) == 1  # the same initialized model until the tardy learner trains
    assert series[-1]["test_error"] < series[0]["test_error"]


class LiveModelError(EngineObserver):
    """The error on each new chunk of the model that decides what to do with it (before any stage it starts)."""

    def __init__(self, chunks):
        self.chunks, self.errors = chunks, []

    def on_decision(self, decision, engine):
        self.errors.append(engine.learner.evaluate(self.chunks[engine.state.chunks_seen - 1])["error"])


def test_prequential_error_is_measured_before_training_on_the_chunk():
    live = LiveModelError(partition(separable_data(MNIST_TASK, 60 * B, seed=1), B, seed=0))  # run_stream's chunks
    series = run_stream(["policy.wait=1"], observers=[live]).state.series
    assert [r["prequential_error"] for r in series] == live.errors
    assert series[0]["prequential_error"] > 0.5  # an untrained 10-class model
    assert series[-1]["prequential_error"] < series[0]["prequential_error"]


@pytest.mark.slow
def test_two_cpu_runs_with_the_same_seed_are_identical():
    keys = ("test_error", "prequential_error", "train_flops", "parameters")
    a = [[r[k] for k in keys] for r in run_stream(["learner.name=ens"]).state.series]
    b = [[r[k] for k in keys] for r in run_stream(["learner.name=ens"]).state.series]
    assert a == b


def test_from_scratch_reinitializes_before_each_later_stage():
    spy = StageSpy()
    scratch = run_stream(["train.from_scratch=true", "policy.wait=3"], observers=[spy]).state.series
    finetune = run_stream(["policy.wait=3"]).state.series
    assert scratch[2]["test_error"] == finetune[2]["test_error"]  # same first stage
    assert scratch[5]["test_error"] != finetune[5]["test_error"]
    assert [s.kind for s in spy.stages] == ["scratch", "scratch"]


@pytest.mark.parametrize("name", ["gmoe", "gens"])
def test_a_growing_learner_retrained_from_scratch_still_grows(name):
    """Growth chooses from the trained model, then the grown architecture is re-drawn and trained whole."""
    spy = StageSpy()
    run_stream(["train.from_scratch=true", "policy.wait=2", f"learner.name={name}"], observers=[spy])
    assert [s.kind for s in spy.stages] == ["scratch", "grow", "grow"]  # nothing trained to grow from at first
    parameters = [s.parameters for s in spy.stages]
    assert parameters[0] < parameters[1] < parameters[2]


def test_a_chunk_is_taken_once_and_a_lower_id_after_a_higher_one_is_a_late_step():
    engine = run_stream(["policy.wait=1"], chunks=2)
    with pytest.raises(ValueError, match="chunk 2 taken twice"):
        engine.on_chunk(Chunk(2, separable_data(MNIST_TASK, 10)))
    assert not engine.on_chunk(Chunk(5, separable_data(MNIST_TASK, 10))).late
    late = engine.on_chunk(Chunk(4, separable_data(MNIST_TASK, 10)))
    assert late.late and late.trained and late.chunk == 4 and late.t == 4
    assert (engine.state.last_chunk, engine.state.late_chunks) == (5, 1)
    assert engine.state.series[-1]["late"] is True and "late" not in engine.state.series[-2]
    assert StepRecord.from_row(engine.state.series[-1]).late


def test_policies_see_the_last_stage_cost_even_after_waiting_steps():
    spy = StageSpy()
    engine = run_stream(["policy.wait=2"], chunks=3, observers=[spy])  # trained at 2, waited at 3
    state = engine.policy_state()
    (stage,) = spy.stages
    trained_on = 2 * 54  # chunks 1 and 2: 60 examples each, 10% held out
    assert stage.train_flops > 0 and stage.train_seconds > 0
    # Per training example, as the budget policy multiplies it by the next stage's examples.
    assert state.flops_per_example == stage.train_flops / trained_on
    assert state.train_seconds_per_example == stage.train_seconds / trained_on
    assert state.chunks_pending == 1 and state.next_stage_examples == 54  # 60 examples, 10% held out


class FakeClock:
    """A settable wall clock: time-based policies become testable without sleeping."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_ticks_between_chunks_train_only_under_time_based_policies():
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}})
    chunks = [Chunk(i, part) for i, part in enumerate(partition(separable_data(MNIST_TASK, 120), 2, seed=0), 1)]

    def engine_with(policy_overrides, clock):
        policy_config = build_config({}, policy_overrides).policy
        learner = build_learner("sm", MNIST_TASK, config.learner, 0)
        return Engine(learner, build_policy(policy_config), MemoryBuffer(), config, torch.device("cpu"), clock=clock)

    clock = FakeClock()
    fixed = engine_with(["policy.wait=5"], clock)
    fixed.on_chunk(chunks[0])
    assert fixed.on_tick() is None  # a fixed wait never fires on the clock alone

    clock = FakeClock()
    scheduled = engine_with(["policy.name=schedule", "policy.interval_seconds=60"], clock)
    scheduled.on_chunk(chunks[0])
    assert scheduled.on_tick() is None  # the first period has not elapsed
    clock.now += 3600
    stage = scheduled.on_tick()
    assert stage is not None and scheduled.state.stages_done >= 1
    assert scheduled.state.cumulative_train_flops >= stage.train_flops > 0


def test_the_engine_reads_one_clock_for_its_start_its_wall_times_and_the_policy():
    """A budget policy divides by the hours since the start: the start must come from the same clock."""
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}})
    clock = FakeClock()
    policy = build_policy(build_config({}, ["policy.name=budget", "policy.flops_per_hour=1e30"]).policy)
    engine = Engine(
        build_learner("sm", MNIST_TASK, config.learner, 0),
        policy,
        MemoryBuffer(),
        config,
        torch.device("cpu"),
        clock=clock,
    )
    clock.now += 30
    engine.on_chunk(Chunk(1, separable_data(MNIST_TASK, 60)))
    assert engine.state.started_at == 1_000_000.0
    assert engine.state.series[-1]["wall_seconds"] == 30.0
    assert engine.policy_state().now - engine.policy_state().started_at == 30.0


def test_a_fire_time_that_passes_with_nothing_pending_is_used_up():
    """A chunk that arrives after a skipped fire time waits for the next one, not trains at once."""
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}})
    chunks = [Chunk(i, part) for i, part in enumerate(partition(separable_data(MNIST_TASK, 120), 2, seed=0), 1)]
    clock = FakeClock()
    policy = build_policy(build_config({}, ["policy.name=schedule", "policy.interval_seconds=60"]).policy)
    learner = build_learner("sm", MNIST_TASK, config.learner, 0)
    engine = Engine(learner, policy, MemoryBuffer(), config, torch.device("cpu"), clock=clock)
    engine.on_chunk(chunks[0])
    clock.now += 61
    assert engine.on_tick() is not None  # the first fire time: chunk 1 trains
    clock.now += 60
    assert engine.on_tick() is None and "skipped" in engine.state.last_decision["reason"]
    clock.now += 10
    engine.on_chunk(chunks[1])
    assert engine.state.stages_done == 1  # chunk 2 waits for the next fire time
    # The stage of the tick has no step record: the results' summary counts it from the totals.
    assert summarize(engine.state.series, 0.0)["stages"] == 1


def test_results_report_a_stage_trained_between_chunks_before_the_next_chunk(tmp_path):
    config = build_config({"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}})
    chunk = Chunk(1, separable_data(MNIST_TASK, 60))
    clock = FakeClock()
    policy = build_policy(build_config({}, ["policy.name=schedule", "policy.interval_seconds=60"]).policy)
    learner = build_learner("sm", MNIST_TASK, config.learner, 0)
    engine = Engine(learner, policy, MemoryBuffer(), config, torch.device("cpu"), clock=clock)
    engine.observers.append(ResultsWriter(tmp_path, {}))
    engine.on_chunk(chunk)
    assert read_results(tmp_path)["summary"]["stages"] == 0
    clock.now += 61
    stage = engine.on_tick()
    assert stage is not None
    summary = read_results(tmp_path)["summary"]
    assert summary["stages"] == 1
    assert summary["cumulative_train_flops"] == engine.state.cumulative_train_flops == stage.train_flops > 0


class FilesAfterEveryStep(EngineObserver):
    """Reads the results files after each step (observers run after the results writer)."""

    def __init__(self, folder):
        self.folder = folder
        self.seen: list[tuple[dict, str]] = []

    def on_step(self, record, engine):
        self.seen.append((read_results(self.folder), (self.folder / "series.csv").read_text()))


def test_the_results_files_hold_the_whole_series_after_every_step_as_a_fresh_writer_would(tmp_path):
    """The writer encodes each row once; its files must still be those of a writer that encodes all."""
    config = {"learner": {"width": 8}}
    reader = FilesAfterEveryStep(tmp_path / "run")
    engine = run_stream(
        ["policy.name=fixed", "policy.wait=2"], observers=[ResultsWriter(tmp_path / "run", config), reader]
    )
    assert [len(results["series"]) for results, _ in reader.seen] == list(range(1, B + 1))
    results, csv_text = reader.seen[-1]
    # What the writer encoding the whole results at once (json.dump of the finite results) wrote.
    expected = json.loads(json.dumps(finite(results_of(engine, config)), indent=1))
    del results["summary"]["wall_seconds"], expected["summary"]["wall_seconds"]
    assert results == expected and results["series"] == engine.state.series
    fresh = ResultsWriter(tmp_path / "fresh", config).write(engine)
    assert (tmp_path / "fresh" / "series.csv").read_text() == csv_text
    csv_rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert [(int(r["t"]), float(r["test_error"])) for r in csv_rows] == [
        (row["t"], row["test_error"]) for row in engine.state.series
    ]
    assert fresh["summary"]["chunks"] == B


def test_a_writer_whose_engine_state_was_replaced_writes_the_new_series(tmp_path):
    """A daemon restores its engine state from the store: other row objects, maybe fewer."""
    writer = ResultsWriter(tmp_path, {})
    engine = run_stream(["policy.name=fixed", "policy.wait=1"], observers=[writer])
    for rows in (B, 3):  # as many rows as were written, then fewer
        engine.state.series = [dict(row, reason=f"restored {i}") for i, row in enumerate(engine.state.series[:rows])]
        engine.state.chunks_seen = rows
        writer.write(engine)
        written = read_results(tmp_path)
        assert [row["reason"] for row in written["series"]] == [f"restored {i}" for i in range(rows)]
        assert written["summary"]["chunks"] == rows
        assert (tmp_path / "series.csv").read_text().count("\n") == rows + 1


def test_a_row_with_a_value_that_is_not_finite_is_written_as_null_in_strict_json(tmp_path):
    """A diverged language model's perplexity is NaN or infinite; JSON has neither."""
    writer = ResultsWriter(tmp_path, {})
    engine = run_stream(["policy.name=fixed", "policy.wait=1"], observers=[writer])
    engine.state.series.append(dict(engine.state.series[-1], t=B + 1, test_error=math.nan, prequential_error=math.inf))
    writer.write(engine)

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    written = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert written["series"][-1]["test_error"] is None and written["series"][-1]["prequential_error"] is None
    assert len(written["series"]) == B + 1


def test_the_freshness_bound_caps_the_models_age_and_rows_show_the_age_and_windowed_measure():
    engine = run_stream(["policy.wait=100", "policy.max_model_age_chunks=2", "stream.prequential_window=3"], chunks=B)
    rows = engine.state.series
    assert [row["model_age_chunks"] for row in rows] == [1, 0, 1, 0, 1, 0]
    assert [row["trained"] for row in rows] == [False, True, False, True, False, True]
    assert rows[1]["reason"].startswith("freshness bound: 2 chunk(s) since the last stage")
    preq = [row["prequential_error"] for row in rows]
    assert rows[-1]["prequential_window_error"] == pytest.approx(sum(preq[-3:]) / 3)
    assert rows[0]["prequential_window_error"] == pytest.approx(preq[0])


def test_the_freshness_bound_in_examples_counts_what_arrived_since_the_last_stage():
    # Chunks of 60 examples: 120 pending waits, the third chunk's 180 reach the bound of 150.
    engine = run_stream(["policy.wait=100", "policy.max_model_age_examples=150"], chunks=B)
    rows = engine.state.series
    assert [row["trained"] for row in rows] == [False, False, True, False, False, True]
    assert rows[2]["reason"].startswith("freshness bound: 180 example(s) since the last stage >= ")
    assert "policy.max_model_age_examples=150" in rows[2]["reason"]


def test_between_chunks_a_bound_in_seconds_trains_any_policy_with_a_chunk_pending():
    config = build_config(
        {"train": {"epochs": 1, "patience": 0}, "learner": {"width": 8}},
        ["policy.wait=100", "policy.max_model_age_seconds=60"],
    )
    clock = FakeClock()
    engine = Engine(
        build_learner("sm", MNIST_TASK, config.learner, 0),
        build_policy(config.policy),
        MemoryBuffer(),
        config,
        torch.device("cpu"),
        clock=clock,
    )
    assert engine.on_tick() is None  # nothing pending
    engine.on_chunk(Chunk(1, separable_data(MNIST_TASK, 60)))
    clock.now += 30
    assert engine.on_tick() is None
    clock.now += 30
    stage = engine.on_tick()
    assert stage is not None and engine.state.stages_done == 1
    assert engine.state.last_decision["reason"].startswith("freshness bound: 60 s since the last stage")
    assert engine.model_age() == (0, 0.0)


def test_a_stage_longer_than_the_bound_in_seconds_is_named_in_one_warning(caplog):
    with caplog.at_level("WARNING", logger="alma_daemon.core.engine"):
        run_stream(["policy.wait=1", "policy.max_model_age_seconds=1e-6", "daemon.poll_seconds=1e-6"], chunks=1)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert re.match(r"policy.max_model_age_seconds=1e-06 is below the \d+ s stage 1 took: every chunk now", warning)


def test_a_replay_set_or_stage_cap_smaller_than_a_chunk_is_named_once(caplog):
    overrides = ["policy.wait=1", "stream.replay=true", "stream.replay_keep=window", "stream.replay_examples=10"]
    with caplog.at_level("WARNING", logger="alma_daemon.core.engine"):
        run_stream([*overrides, "train.max_stage_examples=20"], chunks=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert warnings[0].startswith("stream.replay_examples=10 is smaller than chunk 1's 60 examples: the replay set")
    assert warnings[1].startswith("train.max_stage_examples=20 is smaller than chunk 1's 60 examples: a stage trains")
