"""The Redis buffer: keys of docs/architecture.md, ChunkBuffer behaviour equal to MemoryBuffer under
every stage plan, commits, and the chunk store it keeps the chunks' examples in."""

from __future__ import annotations

import pytest
import torch

from alma_daemon.config import ConfigError
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.stage_plan import StagePlan
from alma_daemon.data.streams import Chunk, split_chunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.chunk_store import ChunkStore
from alma_daemon.service.redis_buffer import RedisBuffer

KEYS = StreamKeys("tiny")
#: Each plan in turn: the paper's (no replay, replay of all) and the bounded ones.
PLANS = {
    "no replay": StagePlan(),
    "replay all": StagePlan("all"),
    "capped": StagePlan(max_stage_examples=50, seed=4),
    "window": StagePlan("window", replay_examples=60, max_stage_examples=70, seed=4),
    "reservoir": StagePlan("reservoir", replay_examples=60, max_stage_examples=70, seed=4),
}


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


def stored(store: ChunkStore) -> list[str]:
    return sorted(path.rsplit("/", 1)[1] for path in store.fs.find(store.folder))


def test_every_key_carries_the_stream_hash_tag() -> None:
    names = [KEYS.part(3, 1), KEYS.chunk(3)] + [
        getattr(KEYS, a)
        for a in (
            "assembling",
            "ready",
            "offsets",
            "dead",
            "ingest",
            "pending",
            "kept",
            "buffered",
            "engine",
            "policy",
            "daemon",
        )
    ]
    assert all(name.startswith("alma:{tiny}:") for name in names)
    assert len(set(names)) == len(names)
    assert KEYS.ready == "alma:{tiny}:ready" and KEYS.part(3, 1) == "alma:{tiny}:part:3:1"
    with pytest.raises(ValueError, match="stream name"):
        StreamKeys("a{b}")


@pytest.mark.integration
@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_redis_buffer_behaves_like_the_memory_buffer(redis_db, tmp_path, plan: StagePlan) -> None:
    store = ChunkStore(str(tmp_path / "chunks"), KEYS.stream)
    memory, buffered = MemoryBuffer(), RedisBuffer.open(redis_db, KEYS, store)
    # 25-example chunks but the 80-example 6 (larger than each cap: cut), some stages over the cap.
    for stage, stage_chunks in enumerate(([1, 2], [3], [4, 5, 6], [7, 8, 9], [10]), start=1):
        for chunk_id in stage_chunks:
            for buffer in (memory, buffered):
                buffer.add(split(chunk_id, 80 if chunk_id == 6 else 25))
        assert buffered.pending_chunks() == memory.pending_chunks() == stage_chunks
        assert buffered.pending_examples() == memory.pending_examples()
        from_memory, from_redis = memory.training_data(plan, stage), buffered.training_data(plan, stage)
        assert from_redis.choice == from_memory.choice
        for a, b in ((from_memory.train, from_redis.train), (from_memory.val, from_redis.val)):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        memory.mark_trained(plan, from_memory.choice)
        buffered.mark_trained(plan, from_redis.choice)
        commit(redis_db, buffered)
        restarted = RedisBuffer(redis_db, KEYS, store)
        assert buffered.kept_chunks() == restarted.kept_chunks() == memory.kept_chunks()
        assert buffered.kept_examples() == restarted.kept_examples() == memory.kept_examples()
    # A restart sweeps the files a committed stage dropped: the store holds the kept chunks alone.
    RedisBuffer.open(redis_db, KEYS, store)
    assert stored(store) == sorted(f"{c}.safetensors" for c in memory.kept_chunks())
    assert not redis_db.keys("alma:{tiny}:split:*")  # the examples live in the chunk store only
    buffered.add(split(11))
    with pytest.raises(ValueError, match="buffered twice"):
        buffered.add(split(11))


@pytest.mark.integration
def test_buffer_changes_are_invisible_until_committed(redis_db, tmp_path) -> None:
    store = ChunkStore(str(tmp_path / "chunks"), KEYS.stream)
    plan = StagePlan()
    buffer = RedisBuffer.open(redis_db, KEYS, store)
    buffer.add(split(1))
    commit(redis_db, buffer)
    buffer.add(split(2))
    buffer.mark_trained(plan, buffer.training_data(plan, 1).choice)
    # A crash here: the restarted daemon sees the state of the last commit, and sweeps chunk 2's file.
    restarted = RedisBuffer.open(redis_db, KEYS, store)
    assert restarted.pending_chunks() == [1] and restarted.pending_examples() == 20
    assert len(restarted.training_data(plan, 1).train) == len(split(1).train)
    assert stored(store) == ["1.safetensors"]

    commit(redis_db, buffer)
    after = RedisBuffer(redis_db, KEYS, store)
    assert after.pending_chunks() == [] and after.kept_chunks() == []


@pytest.mark.integration
def test_a_stage_redone_after_redis_lost_its_commit_finds_the_chunks_it_dropped(redis_db, tmp_path) -> None:
    """Redis with AOF everysec may lose the last commit: the files a stage dropped outlive it until the
    next stage commits, so the redone stage reads them; a restart sweeps what no commit names."""
    store = ChunkStore(str(tmp_path / "chunks"), KEYS.stream)
    plan = StagePlan("window", replay_examples=40)

    def stage(buffer: RedisBuffer, number: int, chunk_id: int):
        buffer.add(split(chunk_id))
        data = buffer.training_data(plan, number)
        buffer.mark_trained(plan, data.choice)
        return data

    buffer = RedisBuffer.open(redis_db, KEYS, store)
    buffer.add(split(1))
    stage(buffer, 1, 2)
    commit(redis_db, buffer)
    names = (KEYS.pending, KEYS.kept, KEYS.buffered)
    before = {key: redis_db.dump(key) for key in names}
    first = stage(buffer, 2, 3)  # the window keeps 2 and 3 and drops 1
    commit(redis_db, buffer)
    assert buffer.kept_chunks() == [2, 3] and stored(store) == [f"{c}.safetensors" for c in (1, 2, 3)]

    for key, value in before.items():  # the last commit lost
        redis_db.delete(key)
        if value is not None:
            redis_db.restore(key, 0, value)
    buffer = RedisBuffer.open(redis_db, KEYS, store)
    assert buffer.kept_chunks() == [1, 2] and stored(store) == ["1.safetensors", "2.safetensors"]
    redone = stage(buffer, 2, 3)
    assert redone.choice == first.choice and torch.equal(redone.train.x, first.train.x)
    commit(redis_db, buffer)
    stage(buffer, 3, 4)  # keeps 3 and 4, drops 2; the next stage commit deletes 1's file
    commit(redis_db, buffer)
    assert stored(store) == [f"{c}.safetensors" for c in (2, 3, 4)]


@pytest.mark.integration
def test_a_start_sweeps_orphans_and_refuses_a_store_without_the_buffered_chunks(redis_db, tmp_path) -> None:
    store = ChunkStore(str(tmp_path / "chunks"), KEYS.stream)
    buffer = RedisBuffer.open(redis_db, KEYS, store)
    buffer.add(split(1))
    commit(redis_db, buffer)
    store.write(split(2))  # a step that never committed
    store.fs.pipe_file(f"{store.folder}/3.safetensors.tmp", b"half")  # a crash mid-write
    store.fs.pipe_file(f"{store.folder}/.probe-x", b"")
    other = ChunkStore(str(tmp_path / "chunks"), "other")
    other.check_writable()
    other.write(split(9))  # another stream's chunk, beside this one's
    RedisBuffer.open(redis_db, KEYS, store)
    assert stored(store) == ["1.safetensors"] and stored(other) == ["9.safetensors"]

    with pytest.raises(ConfigError, match=r"^redis.chunk_store: .* lacks 1 chunks that Redis buffers"):
        RedisBuffer.open(redis_db, KEYS, ChunkStore(str(tmp_path / "elsewhere"), KEYS.stream))


def test_a_chunk_written_again_is_the_same_file(tmp_path) -> None:
    store = ChunkStore(str(tmp_path / "chunks"), KEYS.stream)
    store.check_writable()
    store.write(split(5))
    first = (tmp_path / "chunks" / "tiny" / "5.safetensors").read_bytes()
    store.write(split(5))  # a redone step
    assert (tmp_path / "chunks" / "tiny" / "5.safetensors").read_bytes() == first
    read = store.read(5)
    for a, b in ((read.train, split(5).train), (read.val, split(5).val)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert stored(store) == ["5.safetensors"]
    with pytest.raises(RuntimeError, match="chunk 6 is missing from the chunk store"):
        store.read(6)


@pytest.mark.parametrize(
    "where",
    ["nosuch://bucket/chunks", "s3://user:s3cret@bucket/chunks", "{tmp}/a-file/chunks"],
    ids=["unknown protocol", "filesystem not installed", "not a folder"],
)
def test_an_unusable_chunk_store_fails_in_one_line_naming_the_key(tmp_path, where: str) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError) as caught:
        ChunkStore(where.format(tmp=tmp_path), "mnist").check_writable()
    message = str(caught.value)
    assert message.startswith("redis.chunk_store: cannot write to ") and "\n" not in message
    assert "s3cret" not in message
