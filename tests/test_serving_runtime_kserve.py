"""KServe's side of serving (serving/runtimes/kserve.py) in process, without its server: where a forward
pass runs, and the repository's names (the server itself: tests/test_serving_kserve.py)."""

from __future__ import annotations

import asyncio

import pytest

from alma_daemon.data.datasets import MNIST_TASK
from serving.protocols.codecs import codec_for
from serving.protocols.tensors import tensors_of
from tests.helpers.data import separable_data
from tests.helpers.serving import new_learner

kserve_model = pytest.importorskip("serving.runtimes.kserve", reason="KServe's model server is not installed")


def answer_many(model, batch: int, times: int) -> int:
    """Answer ``times`` requests of ``batch`` MNIST examples; how many ran on a thread."""
    codec = codec_for(MNIST_TASK)
    inputs = tensors_of(codec.encode_oip(separable_data(MNIST_TASK, batch, seed=0).x)["inputs"], "inputs")
    threaded = 0
    real = asyncio.to_thread

    async def counting(*args, **kwargs):
        nonlocal threaded
        threaded += 1
        return await real(*args, **kwargs)

    async def run() -> None:
        for _ in range(times):
            await model._answer(inputs, {})

    asyncio.to_thread = counting
    try:
        asyncio.run(run())
    finally:
        asyncio.to_thread = real
    return threaded


def test_a_forward_pass_expected_to_be_cheaper_than_a_thread_hop_runs_on_the_event_loop(monkeypatch):
    model = kserve_model.CheckpointModel("alma-v1", 1, new_learner())
    monkeypatch.setattr(kserve_model, "INLINE_SECONDS", 60.0)  # whatever the machine's speed
    assert answer_many(model, batch=1, times=10) == 1  # the first runs on a thread, to be timed
    assert model.seconds_per_example is not None and 0 < model.seconds_per_example < 60.0


def test_a_forward_pass_expected_to_be_long_runs_on_a_thread(monkeypatch):
    model = kserve_model.CheckpointModel("alma-v1", 1, new_learner())
    monkeypatch.setattr(kserve_model, "INLINE_SECONDS", 0.0)
    assert answer_many(model, batch=1, times=10) == 10
