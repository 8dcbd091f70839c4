"""The engine measures the test set only when the model changed: fewer passes, the same series bit for bit."""

from __future__ import annotations

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.core.records import TIMING_FIELDS as TIMES
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.learners import build_learner
from policies import build_policy
from tests.helpers.data import separable_data

CHUNKS = 7


class MeasureEveryChunk(Engine):
    """The engine before the skip: a test-set pass after every chunk."""

    def test_measure(self, test_set):
        if test_set is None:
            return None
        measurement, details = self.learner.assess(test_set)
        return measurement.value, details


def run(engine_class: type[Engine], overrides: list[str]) -> tuple[list[dict], int]:
    config = build_config({"train": {"epochs": 2, "patience": 1, "batch_size": 64}, "learner": {"width": 8}}, overrides)
    data = separable_data(MNIST_TASK, 60 * CHUNKS, seed=1)
    test = separable_data(MNIST_TASK, 100, seed=2)
    learner = build_learner("sm", MNIST_TASK, config.learner, config.seed)
    passes = []
    assess = learner.assess
    learner.assess = lambda data: (passes.append(len(data)), assess(data))[1]
    engine = engine_class(
        learner,
        build_policy(config.policy),
        MemoryBuffer(),
        config,
        torch.device("cpu"),
        test_set=test,
    )
    for i, part in enumerate(partition(data, CHUNKS, seed=0), start=1):
        engine.on_chunk(Chunk(i, part))
    series = [{k: v for k, v in record.items() if k not in TIMES} for record in engine.state.series]
    return series, passes.count(len(test))


@pytest.mark.parametrize("wait,stages", [(1, 7), (3, 2), (CHUNKS, 1)])
def test_an_unchanged_model_is_not_measured_again_and_the_series_stays_the_same(wait, stages) -> None:
    overrides = [f"policy.wait={wait}"]
    skipping, skipping_passes = run(Engine, overrides)
    every, every_passes = run(MeasureEveryChunk, overrides)
    assert skipping == every
    assert every_passes == CHUNKS
    # One pass per model version that was measured: the untrained model (while the first stage waits) and
    # each trained one.
    assert skipping_passes == len({r["model_version"] for r in skipping}) == stages + (wait > 1)


def test_a_drifted_test_set_is_measured_even_when_the_model_did_not_change() -> None:
    overrides = ["policy.wait=3", "stream.drift.kind=permute_labels", "stream.drift.at=5"]
    skipping, passes = run(Engine, overrides)
    every, _ = run(MeasureEveryChunk, overrides)
    assert skipping == every
    # versions 0 (chunks 1-2), 1 (chunks 3-4 on the original test set, 5 on the drifted one), 2 (chunk 6-7).
    assert passes == 4
