"""The Redis buffer: keys of docs/architecture.md, ChunkBuffer behaviour equal to MemoryBuffer, commits."""

from __future__ import annotations

import pytest
import torch

from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.data.streams import Chunk, split_chunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.redis_buffer import RedisBuffer

KEYS = StreamKeys("tiny")


def split(chunk_id: int, n: int = 20):
    g = torch.Generator().manual_seed(chunk_id)
    data = LabeledData(
        torch.randint(0, 256, (n, 3, 3), generator=g, dtype=torch.uint8), torch.randint(0, 4, (n,), generator=g)
    )
    return split_chunk(Chunk(chunk_id, data), 0.1, seed=0)


def commit(client, buffer: RedisBuffer) -> None:
    pipe = client.pipeline(transaction=True)
    buffer.stage_commit(pipe)
    pipe.execute()
    buffer.committed()


def test_every_key_carries_the_stream_hash_tag() -> None:
    names = [KEYS.part(3, 1), KEYS.chunk(3), KEYS.split(3)] + [
        getattr(KEYS, a)
        for a in ("assembling", "ready", "offsets", "dead", "ingest", "pending", "kept", "engine", "policy", "daemon")
    ]
    assert all(name.startswith("alma:{tiny}:") for name in names)
    assert len(set(names)) == len(names)
    assert KEYS.ready == "alma:{tiny}:ready" and KEYS.part(3, 1) == "alma:{tiny}:part:3:1"
    with pytest.raises(ValueError, match="stream name"):
        StreamKeys("a{b}")


@pytest.mark.integration
@pytest.mark.parametrize("replay", [False, True])
def test_redis_buffer_behaves_like_the_memory_buffer(redis_db, replay: bool) -> None:
    memory, buffered = MemoryBuffer(), RedisBuffer(redis_db, KEYS)
    for stage_chunks in ([1, 2], [3], [4, 5]):
        for chunk_id in stage_chunks:
            for buffer in (memory, buffered):
                buffer.add(split(chunk_id))
        assert buffered.pending_chunks() == memory.pending_chunks() == stage_chunks
        assert buffered.pending_examples() == memory.pending_examples()
        (train_m, val_m), (train_r, val_r) = memory.training_data(replay), buffered.training_data(replay)
        for a, b in ((train_m, train_r), (val_m, val_r)):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        memory.mark_trained(replay)
        buffered.mark_trained(replay)
        commit(redis_db, buffered)
    stored_splits = sorted(int(k.rsplit(b":", 1)[1]) for k in redis_db.keys("alma:{tiny}:split:*"))
    assert stored_splits == ([1, 2, 3, 4, 5] if replay else [])
    buffered.add(split(6))
    with pytest.raises(ValueError, match="buffered twice"):
        buffered.add(split(6))


@pytest.mark.integration
def test_buffer_changes_are_invisible_until_committed(redis_db) -> None:
    buffer = RedisBuffer(redis_db, KEYS)
    buffer.add(split(1))
    commit(redis_db, buffer)
    buffer.add(split(2))
    buffer.mark_trained(replay=False)
    # A crash here: the restarted daemon sees the state of the last commit.
    restarted = RedisBuffer(redis_db, KEYS)
    assert restarted.pending_chunks() == [1] and restarted.pending_examples() == 20
    assert len(restarted.training_data(replay=False)[0]) == len(split(1).train)

    commit(redis_db, buffer)
    after = RedisBuffer(redis_db, KEYS)
    assert after.pending_chunks() == [] and after.kept_chunks() == []
    assert not redis_db.exists(KEYS.split(1)) and not redis_db.exists(KEYS.split(2))
