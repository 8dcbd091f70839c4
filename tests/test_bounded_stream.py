"""Bounded data on an endless stream, in the daemon: a reservoir replay set and a stage cap give the
simulator's series through a crash mid-stage, and Redis and the chunk store hold only what they must."""

from __future__ import annotations

import pytest

from alma_daemon.config import build_config
from alma_daemon.core.engine import EngineObserver
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.research.simulate import run_simulation
from alma_daemon.service.chunk_store import ChunkStore
from alma_daemon.service.redis_buffer import RedisBuffer
from alma_daemon.transports.redis_stream import RedisStreamPublisher
from alma_daemon.transports.replay import dataset_chunks, replay
from tests.helpers.daemon import Crash, CrashOnce, engine_state, exact, run_daemon, service_config

CHUNKS = 6


class StageSpy(EngineObserver):
    def __init__(self) -> None:
        self.stages: list = []

    def on_stage(self, stage, engine) -> None:
        self.stages.append(stage)


@pytest.mark.integration
def test_a_bounded_daemon_resumes_to_the_simulators_series_keeping_only_the_replay_set(tmp_path, redis_db) -> None:
    # Chunks of 150 examples and a stage every 2: the two pending ones (300), then one replayed (450 of
    # at most 460) from a reservoir of two chunks (300 examples).
    stream = "bounded"
    config = build_config(
        service_config(
            tmp_path,
            None,
            stream,
            stream={
                "megabatches": CHUNKS,
                "train_examples": 900,
                "replay": True,
                "replay_keep": "reservoir",
                "replay_examples": 300,
            },
            train={"max_stage_examples": 460},
            policy={"wait": 2},
        )
    )
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), stream, progress=False)
    with pytest.raises(Crash):  # stage 2 trained, its chunks marked, nothing committed
        run_daemon(config, redis_db, until=CHUNKS, observers=[CrashOnce("checkpoint", 2)])
    spy = StageSpy()
    run_daemon(config, redis_db, until=CHUNKS, observers=[spy])
    assert [(s.chunks, s.examples) for s in spy.stages] == [([3, 4], 450), ([5, 6], 450)]

    state = engine_state(redis_db, stream)
    simulated = run_simulation(config, progress=False)
    assert exact(state["series"]) == exact(simulated["series"])
    stages = [row for row in state["series"] if row["trained"]]
    assert len(stages) == 3

    keys = StreamKeys(stream)
    store = ChunkStore.for_config(config)
    buffer = RedisBuffer.open(redis_db, keys, store)  # a restart: the sweep leaves the replay set alone
    assert len(buffer.kept_chunks()) == 2 and buffer.kept_examples() == 300 and buffer.pending_chunks() == []
    files = sorted(path.rsplit("/", 1)[1] for path in store.fs.find(store.folder))
    assert files == [f"{c}.safetensors" for c in buffer.kept_chunks()]
    # Redis holds the ids and sizes of the chunks taken, not their examples.
    assert {int(k): int(v) for k, v in redis_db.hgetall(keys.buffered).items()} == dict.fromkeys(
        buffer.kept_chunks(), 150
    )
    assert not redis_db.keys(f"alma:{{{stream}}}:split:*") and not redis_db.keys(f"alma:{{{stream}}}:part:*")
