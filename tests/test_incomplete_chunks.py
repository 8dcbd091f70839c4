"""Chunks that cannot complete are dead-lettered, not held: one announcing more parts than
``redis.max_buffer_bytes`` holds at once, one still incomplete ``daemon.incomplete_chunk_seconds``
after its first part once ingest has read all the transport holds.

Every part below is one example of ``records_of`` (144 bytes), so limits are counted in parts. The
clock is a fake one that the tests move: nothing here sleeps or measures time.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from alma_daemon import metrics
from alma_daemon.data.wire import HEADER_PARTS, REJECT_REASONS
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.assembler import Assembler
from alma_daemon.service.ingest.worker import IngestClock, IngestLimits, IngestWorker
from alma_daemon.service.redis_buffer import ReadyChunks
from alma_daemon.service.reorder import ReorderGate
from alma_daemon.transports.redis_stream import RedisStreamSource, encode_entry
from tests.helpers.records import SCHEMA, STREAM, decoded, records_of, with_header

TRANSPORT = "alma.tiny"
PART = len(records_of(1, n=1)[0].value)
KEYS = StreamKeys(STREAM)
LIMIT_SECONDS = 60.0


class FakeClock:
    """A wall clock that moves only when told."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def redis_worker(
    client, max_buffer_bytes: int = 1 << 30, incomplete_chunk_seconds: float | None = None, **kwargs
) -> IngestWorker:
    limits = IngestLimits(max_buffer_bytes, incomplete_chunk_seconds=incomplete_chunk_seconds)
    return IngestWorker(RedisStreamSource(client, TRANSPORT), client, KEYS, SCHEMA, limits, **kwargs)


def aging_worker(client, clock: FakeClock) -> IngestWorker:
    """An ingest worker that gives chunks up after LIMIT_SECONDS by ``clock`` and asks the transport's
    lag at every step (so a test knows when it has caught up)."""
    return redis_worker(
        client, incomplete_chunk_seconds=LIMIT_SECONDS, clock=IngestClock(now=clock, lag_refresh_seconds=0)
    )


def publish(client, records) -> None:
    for record in records:
        client.xadd(TRANSPORT, encode_entry(record))


def read_all(worker: IngestWorker, client, limit_seconds: float = 30) -> None:
    """Step until the transport stream is empty (a safety limit, not a timing check)."""
    deadline = time.monotonic() + limit_seconds
    while client.xlen(TRANSPORT):
        assert time.monotonic() < deadline, f"ingest stalled: {client.xlen(TRANSPORT)} unread"
        worker.step(timeout=0.05)
        worker.flush()


def settle(worker: IngestWorker) -> None:
    """Two empty steps: the first learns the transport is read (lag 0), the second may act on it."""
    for _ in range(2):
        worker.step(timeout=0.05)
        worker.flush()


def dead_letters(client) -> list[tuple[str, str]]:
    return [(f[b"reason"].decode(), f[b"detail"].decode()) for _, f in client.xrange(KEYS.dead)]


def chunk_ids(client, key: str) -> list[int]:
    return [int(c) for c in client.zrange(key, 0, -1)]


def stored_chunks(client) -> set[int]:
    """The chunks with a hash or a part in Redis."""
    keys = [k.decode() for k in client.scan_iter(f"{KEYS.prefix}:*")]
    return {int(k.split(":")[3]) for k in keys if k.split(":")[2] in ("part", "chunk")}


# -- the assembler (pure logic) -------------------------------------------------------------------
def test_a_part_announcing_more_parts_than_the_bound_holds_is_refused_at_once_with_its_later_parts() -> None:
    assembler = Assembler(STREAM, max_bytes=10 * PART)
    parts = decoded(records_of(1, n=40))
    refused = assembler.accept(parts[0], PART)
    assert not refused.store and list(refused.dropped) == [1] and assembler.refused == {1}
    progress, why = refused.dropped[1]
    assert why.reason == "size" and not progress.got and not assembler.in_progress
    assert why.detail.startswith(f"chunk 1 is larger than redis.max_buffer_bytes ({10 * PART}): it announces 40 parts")
    assert f"make at least {39 * PART} bytes" in why.detail
    later = [assembler.accept(part, PART) for part in parts[1:]]
    assert not any(outcome.store or outcome.dropped for outcome in later)


def test_an_absurd_count_of_parts_is_refused_at_its_first_part() -> None:
    assembler = Assembler(STREAM, max_bytes=1 << 30)
    part = dataclasses.replace(decoded(records_of(1, n=1))[0], parts=10**9)
    outcome = assembler.accept(part, PART)
    assert not outcome.store and outcome.dropped[1][1].reason == "size"
    assert "it announces 1000000000 parts" in outcome.dropped[1][1].detail


def test_a_chunk_that_fits_is_not_refused_though_its_last_part_is_smaller_than_the_others() -> None:
    # Three parts: two of PART bytes and a last one of 10, exactly the bound. Whichever comes first,
    # the parts still missing are not taken to outgrow it.
    parts = decoded(records_of(1, n=3))
    sizes = [PART, PART, 10]
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        assembler = Assembler(STREAM, max_bytes=2 * PART + 10)
        outcomes = [assembler.accept(parts[i], sizes[i]) for i in order]
        assert all(o.store and not o.dropped for o in outcomes) and outcomes[-1].completed is not None, order


def test_a_chunk_incomplete_past_its_age_is_given_up_and_its_later_parts_are_skipped() -> None:
    clock = FakeClock()
    assembler = Assembler(STREAM, max_age=LIMIT_SECONDS, clock=clock)
    first, second, third = decoded(records_of(1, n=3))
    assembler.accept(first, PART)
    clock.advance(LIMIT_SECONDS / 2)
    assembler.accept(second, PART)  # a later part does not restart the age
    assert assembler.expire() == {}
    clock.advance(LIMIT_SECONDS / 2 + 1)
    (chunk_id, (progress, why)), *others = assembler.expire().items()
    assert chunk_id == 1 and not others and progress.got == {0, 1}
    assert why.reason == "incomplete" and why.reason in REJECT_REASONS
    assert why.detail == (
        f"chunk 1 has 2 of 3 parts ({2 * PART} bytes) 61 s after its first part arrived: "
        "daemon.incomplete_chunk_seconds allows 60 s; its later parts are skipped"
    )
    assert not assembler.in_progress and assembler.bytes == 0 and assembler.refused == {1}
    late = assembler.accept(third, PART)
    assert not late.store and late.completed is None and not late.dropped


def test_without_an_age_a_chunk_waits_for_its_parts_for_ever() -> None:
    clock = FakeClock()
    assembler = Assembler(STREAM, clock=clock)
    assembler.accept(decoded(records_of(1, n=3))[0], PART)
    clock.advance(10**9)
    assert assembler.expire() == {} and list(assembler.in_progress) == [1]


# -- against Redis --------------------------------------------------------------------------------
@pytest.mark.integration
def test_an_absurd_count_of_parts_is_dead_lettered_at_once_and_the_next_chunk_is_stored(redis_db) -> None:
    huge = with_header(records_of(1, n=1)[0], HEADER_PARTS, str(10**9).encode())
    publish(redis_db, [huge, *records_of(2, n=2)])
    worker = redis_worker(redis_db, max_buffer_bytes=1 << 20)
    read_all(worker, redis_db)
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [2] and not chunk_ids(redis_db, KEYS.assembling)
    [(reason, detail)] = dead_letters(redis_db)
    assert reason == "size" and "it announces 1000000000 parts" in detail
    assert redis_db.hget(KEYS.ingest, "refused_chunks") == b"1" and stored_chunks(redis_db) == {2}


@pytest.mark.integration
def test_a_chunk_incomplete_for_too_long_is_dead_lettered_deleted_and_no_longer_waited_for(redis_db) -> None:
    clock = FakeClock()
    before = metrics.RECORDS_REJECTED.labels("incomplete")._value.get()
    one, two = records_of(1, n=3), records_of(2, n=2)
    publish(redis_db, [one[0], *two])
    worker = aging_worker(redis_db, clock)
    read_all(worker, redis_db)
    settle(worker)
    assert chunk_ids(redis_db, KEYS.assembling) == [1] and chunk_ids(redis_db, KEYS.ready) == [2]
    assert ReadyChunks(redis_db, KEYS).lowest_assembling() == 1  # what holds chunk 2 back before a first chunk

    clock.advance(LIMIT_SECONDS + 1)
    settle(worker)
    [(reason, detail)] = dead_letters(redis_db)
    assert reason == "incomplete" and detail.startswith("chunk 1 has 1 of 3 parts")
    assert not chunk_ids(redis_db, KEYS.assembling) and stored_chunks(redis_db) == {2}
    ingest = redis_db.hgetall(KEYS.ingest)
    assert ingest[b"rejected:incomplete"] == b"1" and ingest[b"records_rejected"] == b"1"
    assert ingest[b"refused_chunks"] == b"1"
    assert metrics.RECORDS_REJECTED.labels("incomplete")._value.get() == before + 1
    lowest = ReadyChunks(redis_db, KEYS).lowest_assembling()
    assert lowest is None and ReorderGate(30.0).choose([2], 0, lowest, clock()).take == 2

    publish(redis_db, one[1:])  # its late parts are skipped: nothing stored, nothing dead-lettered again
    read_all(worker, redis_db)
    settle(worker)
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [2] and not chunk_ids(redis_db, KEYS.assembling)
    assert len(dead_letters(redis_db)) == 1 and int(redis_db.hget(KEYS.ingest, "chunks_received")) == 1
    assert stored_chunks(redis_db) == {2}


@pytest.mark.integration
def test_a_restarted_ingest_ages_a_chunk_from_its_first_part_as_an_uninterrupted_one(redis_db) -> None:
    clock = FakeClock()
    first = records_of(1, n=3)[0]
    publish(redis_db, [first])
    worker = aging_worker(redis_db, clock)
    read_all(worker, redis_db)
    worker.stop()  # what a killed worker leaves: its batches are committed
    arrived = clock()
    clock.advance(LIMIT_SECONDS - 1)
    restarted = aging_worker(redis_db, clock)
    assert restarted.assembler.in_progress[1].arrived_at == pytest.approx(arrived, abs=0.001)
    settle(restarted)
    assert chunk_ids(redis_db, KEYS.assembling) == [1] and not dead_letters(redis_db)
    clock.advance(2)
    settle(restarted)
    restarted.stop()
    assert [reason for reason, _ in dead_letters(redis_db)] == ["incomplete"]
    assert not chunk_ids(redis_db, KEYS.assembling)


@pytest.mark.integration
def test_parts_waiting_unread_behind_a_backlog_complete_their_chunk_before_it_is_given_up(redis_db) -> None:
    """A daemon stopped for longer than the age: the rest of the chunk waits in the transport, behind
    other chunks, and is read before the chunk is given up."""
    clock = FakeClock()
    one = records_of(1, n=3)
    publish(redis_db, one[:1])
    worker = aging_worker(redis_db, clock)
    read_all(worker, redis_db)
    worker.stop()
    backlog = [record for chunk_id in range(2, 42) for record in records_of(chunk_id, n=1)]
    publish(redis_db, [*backlog, *one[1:]])  # more than one poll's worth before chunk 1's last parts
    clock.advance(10 * LIMIT_SECONDS)
    restarted = aging_worker(redis_db, clock)
    read_all(restarted, redis_db)
    settle(restarted)
    restarted.stop()
    assert not dead_letters(redis_db) and not chunk_ids(redis_db, KEYS.assembling)
    assert chunk_ids(redis_db, KEYS.ready) == list(range(1, 42))


@pytest.mark.integration
def test_a_chunk_given_up_while_ingest_keeps_reading_leaves_the_transport_stream_read(redis_db) -> None:
    """The batch that gives a chunk up carries no record; the offsets stay where the records left them."""
    clock = FakeClock()
    publish(redis_db, records_of(1, n=3)[:1])
    worker = aging_worker(redis_db, clock)
    read_all(worker, redis_db)
    settle(worker)
    offsets = redis_db.hgetall(KEYS.offsets)
    clock.advance(LIMIT_SECONDS + 1)
    settle(worker)
    worker.stop()
    assert redis_db.hgetall(KEYS.offsets) == offsets and redis_db.xlen(TRANSPORT) == 0
    assert [reason for reason, _ in dead_letters(redis_db)] == ["incomplete"]
