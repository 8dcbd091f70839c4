"""The stage plan: what a stage trains on (the cap), and which chunks stay for replay (all, window,
reservoir), deterministic and independent of what was kept before; both buffers follow it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from alma_daemon.config import ConfigError, build_config
from alma_daemon.config.sections import DEFAULT_REPLAY_EXAMPLES
from alma_daemon.core.chunk_buffer import MemoryBuffer, cut_split
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.stage_plan import StageChoice, StagePlan
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition, split_chunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from policies import build_policy
from tests.helpers.data import separable_data

SIZE = 10


def sizes(ids, size: int = SIZE) -> dict[int, int]:
    return dict.fromkeys(ids, size)


def streamed(plan: StagePlan, chunks: int, per_stage: int, size: int = SIZE) -> tuple[int, ...]:
    """The replay set after ``chunks`` chunks trained ``per_stage`` at a time."""
    kept: tuple[int, ...] = ()
    for first in range(1, chunks + 1, per_stage):
        pending = list(range(first, min(first + per_stage, chunks + 1)))
        examples = sizes([*kept, *pending], size)
        choice = plan.choose(first, pending, kept, examples)
        kept, _ = plan.after_stage(pending, kept, choice.trained, examples)
    return kept


def test_the_plan_follows_the_config() -> None:
    config = build_config(
        {
            "stream": {"replay": True, "replay_keep": "reservoir", "replay_examples": 500, "seed": 7},
            "train": {"max_stage_examples": 200},
        }
    )

    def plan(config, team_task: bool = False) -> StagePlan:
        return StagePlan.from_config(config, config.stream.recipe(team_task))

    assert plan(config) == plan(config, team_task=True) == StagePlan("reservoir", 500, 200, 7)
    assert plan(build_config({})) == StagePlan("none", None, None, 0)
    assert plan(build_config({"stream": {"replay": True}})).keep == "all"
    # A team's task replays a class-stratified sample of examples, kept by the engine, not chunks.
    assert plan(build_config({}), team_task=True) == StagePlan("classes", DEFAULT_REPLAY_EXAMPLES, None, 0)
    assert plan(build_config({"stream": {"replay": False}}), team_task=True).keep == "none"
    assert plan(build_config({"stream": {"replay_keep": "window", "replay_examples": 9}})).keep == "window"
    assert StagePlan("classes", 100).replay_set([1, 2], {1: 5, 2: 5}) == ()
    with pytest.raises(ConfigError, match="stream.replay_examples"):
        build_config({"stream": {"replay": True, "replay_keep": "window"}})
    with pytest.raises(ValueError, match="needs replay_examples"):
        StagePlan("window")


def test_without_a_cap_a_stage_trains_on_every_pending_and_kept_chunk() -> None:
    plan = StagePlan("all")
    choice = plan.choose(3, [5, 4], [1, 2, 3], sizes(range(1, 6)))
    assert choice == StageChoice(trained=(4, 5), dropped=(), replayed=(1, 2, 3))
    assert choice.chunks == (1, 2, 3, 4, 5)
    assert plan.after_stage([5, 4], [1, 2, 3], choice.trained, sizes(range(1, 6))) == ((1, 2, 3, 4, 5), ())
    assert StagePlan().after_stage([5, 4], [], (4, 5), sizes([4, 5])) == ((), (4, 5))


def test_the_cap_takes_the_newest_pending_chunks_and_drops_the_rest() -> None:
    plan = StagePlan(max_stage_examples=25)
    choice = plan.choose(1, [1, 2, 3, 4], [], sizes([1, 2, 3, 4]))
    assert choice == StageChoice(trained=(3, 4), dropped=(1, 2), replayed=())
    # A late chunk (a lower id) is older data: the newest ids win, whatever the arrival order.
    assert plan.choose(1, [4, 1, 3], [], sizes([1, 3, 4])).trained == (3, 4)
    # The newest chunk that does not fit ends the stage's pending share, even if an older one would fit.
    uneven = {1: 5, 2: 20, 3: 10}
    assert plan.choose(1, [1, 2, 3], [], uneven) == StageChoice(trained=(3,), dropped=(1, 2), replayed=())


def test_replay_fills_what_the_cap_leaves_with_a_sample_seeded_by_the_stage() -> None:
    plan = StagePlan("all", max_stage_examples=50, seed=3)
    kept, pending = list(range(1, 21)), [21, 22]
    examples = sizes(range(1, 23))
    choices = {stage: plan.choose(stage, pending, kept, examples) for stage in range(1, 30)}
    for choice in choices.values():
        assert choice.trained == (21, 22) and choice.dropped == () and len(choice.replayed) == 3
        assert set(choice.replayed) <= set(kept)
    assert plan.choose(5, pending, kept, examples) == choices[5]  # the same stage, the same sample
    assert len({c.replayed for c in choices.values()}) > 20  # another stage, another sample
    # Every kept chunk comes up about equally often over many stages.
    counts = Counter(c for stage in range(1, 2001) for c in plan.choose(stage, pending, kept, examples).replayed)
    assert set(counts) == set(kept) and max(counts.values()) < 1.35 * min(counts.values())


def test_a_chunk_larger_than_the_cap_is_cut_to_a_seeded_sample_of_it() -> None:
    plan = StagePlan("all", max_stage_examples=30, seed=1)
    examples = {1: 10, 2: 100, 3: 100}
    choice = plan.choose(4, [2, 3], [1], examples)
    assert choice == StageChoice(trained=(3,), dropped=(2,), replayed=(), cut=(3, 30))
    # Nothing pending, every kept chunk larger than the cap: one kept chunk is cut.
    only_kept = plan.choose(4, [], [2, 3], examples)
    assert only_kept.trained == () and only_kept.cut in ((2, 30), (3, 30))
    assert only_kept.replayed == (only_kept.cut[0],)

    data = LabeledData(torch.arange(100).view(100, 1), torch.arange(100) % 4)
    split = split_chunk(Chunk(3, data), 0.1, seed=0)
    cut = cut_split(split, 30, seed=1, stage=4)
    assert (len(cut.train), len(cut.val)) == (27, 3)
    train, val = set(cut.train.x.flatten().tolist()), set(cut.val.x.flatten().tolist())
    assert train <= set(split.train.x.flatten().tolist()) and val <= set(split.val.x.flatten().tolist())
    again = cut_split(split, 30, seed=1, stage=4)
    assert torch.equal(again.train.x, cut.train.x) and torch.equal(again.val.x, cut.val.x)
    assert not torch.equal(cut_split(split, 30, seed=1, stage=5).train.x, cut.train.x)
    assert len(cut_split(split, 1, seed=1, stage=4).train) == 1  # at least one example to train on


def test_a_window_keeps_the_newest_chunks_within_its_examples() -> None:
    plan = StagePlan("window", replay_examples=35)
    assert plan.replay_set(range(1, 10), sizes(range(1, 10))) == (7, 8, 9)
    assert plan.replay_set([3, 9, 1], {1: 10, 3: 10, 9: 40}) == ()  # the newest alone is too large
    assert streamed(plan, 50, per_stage=3) == (48, 49, 50)


def test_a_reservoir_is_a_function_of_the_chunks_trained_whatever_the_stages() -> None:
    plan = StagePlan("reservoir", replay_examples=100, seed=11)
    whole = plan.replay_set(range(1, 301), sizes(range(1, 301)))
    assert len(whole) == 10
    # Stage by stage, from the kept set alone (as after a restart), the reservoir is the same.
    assert streamed(plan, 300, per_stage=1) == streamed(plan, 300, per_stage=7) == whole
    assert StagePlan("reservoir", replay_examples=100, seed=12).replay_set(range(1, 301), sizes(range(1, 301))) != whole


def test_a_reservoir_samples_the_whole_stream_uniformly() -> None:
    # Over seeds, each of 40 chunks is kept about equally often (4 of 40, 1 in 10); a window would keep
    # only the newest.
    counts = Counter(
        c for seed in range(500) for c in streamed(StagePlan("reservoir", replay_examples=40, seed=seed), 40, 3)
    )
    assert sum(counts.values()) == 500 * 4 and set(counts) == set(range(1, 41))
    assert max(counts.values()) < 2 * min(counts.values())
    early, late = sum(counts[c] for c in range(1, 21)), sum(counts[c] for c in range(21, 41))
    assert abs(early - late) < 0.15 * (early + late)


def test_the_next_stage_examples_follow_the_plan() -> None:
    assert StagePlan().stage_examples(30, 0) == 30
    assert StagePlan("all").stage_examples(30, 70) == 100
    assert StagePlan("all", max_stage_examples=50).stage_examples(30, 70) == 50


def test_the_memory_buffer_trains_and_keeps_what_the_plan_says() -> None:
    plan = StagePlan("window", replay_examples=40, max_stage_examples=50, seed=2)
    buffer = MemoryBuffer()
    trained_on: list[tuple[int, ...]] = []
    for stage, chunk_ids in enumerate(([1, 2], [3, 4, 5, 6, 7], [8]), start=1):
        for chunk_id in chunk_ids:
            data = LabeledData(torch.full((20, 1), chunk_id), torch.zeros(20, dtype=torch.long))
            buffer.add(split_chunk(Chunk(chunk_id, data), 0.1, seed=0))
        stage_data = buffer.training_data(plan, stage)
        assert len(stage_data.train) + len(stage_data.val) <= 50
        assert set(stage_data.train.x.flatten().tolist()) == set(stage_data.choice.chunks)
        trained_on.append(stage_data.choice.chunks)
        buffer.mark_trained(plan, stage_data.choice)
        assert buffer.pending_chunks() == [] and buffer.kept_examples() <= 40
    assert trained_on[1] == (6, 7)  # the two newest fill the cap; 3, 4 and 5 are dropped
    assert stage_data.dropped == () and buffer.kept_chunks() == [7, 8]
    with pytest.raises(ValueError, match="no chunk to train on"):
        MemoryBuffer().training_data(plan, 1)


class Stages(EngineObserver):
    def __init__(self) -> None:
        self.stages: list = []

    def on_stage(self, stage, engine) -> None:
        self.stages.append(stage)


def test_the_engine_trains_each_stage_on_at_most_the_cap_and_records_what_it_skipped() -> None:
    # Chunks of 60 examples, a stage every 3 chunks, at most 130 examples a stage, a replay window of 150.
    config = build_config(
        {
            "stream": {"replay": True, "replay_keep": "window", "replay_examples": 150},
            "train": {"epochs": 1, "patience": 0, "batch_size": 64, "max_stage_examples": 130},
            "learner": {"width": 8},
            "policy": {"wait": 3},
        }
    )
    learner = build_learner(config.learner.name, MNIST_TASK, config.learner, config.seed)
    spy = Stages()
    engine = Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), observers=[spy])
    for i, part in enumerate(partition(separable_data(MNIST_TASK, 360, seed=1), 6, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
        if i == 5:  # 2 pending (120) and 2 kept (120), capped at 130
            assert engine.policy_state().next_stage_examples == round(130 * (1 - config.stream.val_fraction))
    first, second = spy.stages
    assert (first.chunks, first.skipped, first.examples) == ([2, 3], [1], 120)
    # The newest two pending chunks take 120 of the 130: no kept chunk of 60 fits in the rest.
    assert (second.chunks, second.skipped, second.examples) == ([5, 6], [4], 120)
    assert engine.buffer.kept_chunks() == [5, 6]
    assert engine.state.series[-1]["examples_seen"] == 360
