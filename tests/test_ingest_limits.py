"""Ingest's limits: hostile transport entries, the bound on incomplete chunks, pausing, reporting.

Every part below is one example of ``records_of`` (144 bytes), so limits are counted in parts.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from alma_daemon import metrics
from alma_daemon.data.wire_format import DEFAULT_MAX_CHUNKS_AHEAD
from alma_daemon.infra.outages import OutageBoard
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.assembler import Assembler
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker
from alma_daemon.transports.redis_stream import RedisStreamSource, encode_entry
from tests.helpers.records import SCHEMA, STREAM, decoded, records_of
from tests.helpers.servers import RedisServer

TRANSPORT = "alma.tiny"
PART = len(records_of(1, n=1)[0].value)
KEYS = StreamKeys(STREAM)


def redis_worker(
    client, max_buffer_bytes: int, transport_client=None, max_chunks_ahead: int = DEFAULT_MAX_CHUNKS_AHEAD, **kwargs
) -> IngestWorker:
    source = RedisStreamSource(transport_client or client, TRANSPORT)
    limits = IngestLimits(max_buffer_bytes, max_chunks_ahead)
    return IngestWorker(source, client, KEYS, SCHEMA, limits, **kwargs)


def publish(client, records) -> None:
    for record in records:
        client.xadd(TRANSPORT, encode_entry(record))


def read_all(worker: IngestWorker, client, limit_seconds: float = 30) -> None:
    """Step until the transport stream is empty (a safety limit, not a timing check)."""
    deadline = time.monotonic() + limit_seconds
    while client.xlen(TRANSPORT):
        assert time.monotonic() < deadline, f"ingest stalled: paused={worker.paused}, {client.xlen(TRANSPORT)} unread"
        worker.step(timeout=0.2)
        worker.flush()


def dead_letters(client) -> list[tuple[str, str]]:
    return [(f[b"reason"].decode(), f[b"detail"].decode()) for _, f in client.xrange(KEYS.dead)]


def chunk_ids(client, key: str) -> list[int]:
    return [int(c) for c in client.zrange(key, 0, -1)]


def assembling_bytes(client) -> int:
    return sum(int(client.hget(KEYS.chunk(c), "bytes") or 0) for c in chunk_ids(client, KEYS.assembling))


def assert_parts_match_chunks(client) -> None:
    """Every stored part belongs to a chunk assembling or ready, whose hash lists it, and back."""
    listed = set()
    for chunk_id in chunk_ids(client, KEYS.assembling) + chunk_ids(client, KEYS.ready):
        fields = client.hgetall(KEYS.chunk(chunk_id))
        assert fields, f"chunk {chunk_id} has no hash"
        listed |= {KEYS.part(chunk_id, int(f[4:])) for f in fields if f.startswith(b"got:")}
    assert {k.decode() for k in client.scan_iter(f"{KEYS.prefix}:part:*")} == listed
    chunk_hashes = {k.decode() for k in client.scan_iter(f"{KEYS.prefix}:chunk:*")}
    assert chunk_hashes == {KEYS.chunk(c) for c in chunk_ids(client, KEYS.assembling) + chunk_ids(client, KEYS.ready)}


# -- the assembler (pure logic) -------------------------------------------------------------------
def test_assembler_refuses_a_chunk_larger_than_its_bound_and_skips_the_chunks_later_parts() -> None:
    assembler = Assembler(STREAM, max_bytes=2 * PART - 1, max_ahead=1)
    big = decoded(records_of(1, n=3))
    # A small first part fits with the two parts it announces; a larger second part does not.
    assert assembler.accept(big[0], PART // 2).store
    refused = assembler.accept(big[1], 2 * PART)
    assert not refused.store and list(refused.dropped) == [1]
    progress, why = refused.dropped[1]
    assert progress.got == {0} and why.reason == "size"
    assert "chunk 1 is larger than redis.max_buffer_bytes" in why.detail
    assert not assembler.in_progress and assembler.bytes == 0
    last = assembler.accept(big[2], PART)
    assert not last.store and not last.dropped and assembler.refused == {1}
    again = assembler.accept(big[0], PART)  # a re-sent part is skipped too, not stored again
    assert not again.store and not again.dropped and not assembler.in_progress
    small = assembler.accept(decoded(records_of(2, n=1))[0], PART)
    assert small.completed is not None and assembler.last_completed == 2
    assert not assembler.refused  # chunk 1 is behind the window: the order guard rejects its parts


def test_assembler_drops_the_incomplete_chunks_with_the_lowest_ids_first_to_stay_within_its_bound() -> None:
    assembler = Assembler(STREAM, max_bytes=2 * PART)
    first_parts = {c: decoded(records_of(c, n=3))[0] for c in (5, 3, 4)}
    outcomes = {c: assembler.accept(part, PART) for c, part in first_parts.items()}
    assert not outcomes[5].dropped and not outcomes[3].dropped
    assert list(outcomes[4].dropped) == [3]  # the lowest id, though not the first to arrive
    assert outcomes[4].dropped[3][1].reason == "size" and "redis.max_buffer_bytes" in outcomes[4].dropped[3][1].detail
    second_of_4 = assembler.accept(decoded(records_of(4, n=3))[1], PART)
    assert list(second_of_4.dropped) == [5]  # never the part's own chunk, though its id is lower
    assert list(assembler.in_progress) == [4] and assembler.bytes == 2 * PART
    again = assembler.accept(first_parts[3], PART)  # a dropped chunk's part starts it again
    assert list(again.dropped) == [4] and assembler.in_progress[3].got == {0}


# -- against Redis --------------------------------------------------------------------------------
@pytest.mark.integration
def test_a_redis_stream_entry_with_deeply_nested_headers_is_dead_lettered_and_ingestion_continues(redis_db) -> None:
    redis_db.xadd(TRANSPORT, {"key": b"tiny/1", "value": b"", "headers": b"[" * 100_000})
    publish(redis_db, records_of(1))
    worker = redis_worker(redis_db, 1 << 30)
    read_all(worker, redis_db)
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [1]
    assert [reason for reason, _ in dead_letters(redis_db)] == ["headers"]
    assert int(redis_db.hget(KEYS.ingest, "rejected:headers")) == 1


@pytest.mark.integration
def test_a_chunk_larger_than_the_buffer_limit_is_dead_lettered_and_the_next_chunk_is_stored(redis_db) -> None:
    before = metrics.RECORDS_REJECTED.labels("size")._value.get()
    publish(redis_db, records_of(1, n=40) + records_of(2, n=4))
    worker = redis_worker(redis_db, max_buffer_bytes=10 * PART)
    read_all(worker, redis_db)
    assert not worker.paused
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [2] and not chunk_ids(redis_db, KEYS.assembling)
    [(reason, detail)] = dead_letters(redis_db)
    assert reason == "size" and detail.startswith("chunk 1 is larger than redis.max_buffer_bytes")
    assert int(redis_db.hget(KEYS.ingest, "rejected:size")) == 1
    assert metrics.RECORDS_REJECTED.labels("size")._value.get() == before + 1
    assert int(redis_db.hget(KEYS.ingest, "queued_bytes")) == 4 * PART
    assert_parts_match_chunks(redis_db)


@pytest.mark.integration
def test_first_parts_of_chunks_that_never_complete_cannot_stall_ingest_or_outgrow_the_limit(redis_db) -> None:
    limit = 4 * PART
    worker = redis_worker(redis_db, max_buffer_bytes=limit, max_chunks_ahead=1)
    for chunk_id in range(1, 11):  # their other two parts never come
        publish(redis_db, records_of(chunk_id, n=3)[:1])
        read_all(worker, redis_db)
        assert assembling_bytes(redis_db) <= limit
    publish(redis_db, records_of(11, n=2))
    read_all(worker, redis_db)
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [11] and not chunk_ids(redis_db, KEYS.assembling)
    dead = dead_letters(redis_db)
    # Chunks 1-8 made room (the lowest ids first); 9 and 10 were abandoned when 11 completed (the
    # window of one id left them behind).
    assert [detail.split()[1] for _, detail in dead] == [str(c) for c in range(1, 11)]
    assert [reason for reason, _ in dead] == ["size"] * 8 + ["part_numbering"] * 2
    assert_parts_match_chunks(redis_db)


@pytest.mark.integration
def test_a_chunk_dropped_and_started_again_in_one_transaction_is_stored_consistently(redis_db) -> None:
    a, b = records_of(1, n=2), records_of(2, n=3)
    publish(redis_db, [a[0], b[0], b[1], a[1], b[2]])  # a[1] drops chunk 2; b[2] starts it again
    worker = redis_worker(redis_db, max_buffer_bytes=3 * PART)
    read_all(worker, redis_db)
    worker.stop()
    assert [reason for reason, _ in dead_letters(redis_db)] == ["size"]
    assert chunk_ids(redis_db, KEYS.ready) == [1] and chunk_ids(redis_db, KEYS.assembling) == [2]
    assert_parts_match_chunks(redis_db)
    assert redis_db.hget(KEYS.chunk(2), "got:2") and not redis_db.hget(KEYS.chunk(2), "got:0")
    restarted = redis_worker(redis_db, max_buffer_bytes=3 * PART)
    assert restarted.assembler.in_progress[2].got == {2} and restarted.assembler.bytes == PART
    restarted.stop()


def chunk_fields(client, chunk_id: int) -> dict[bytes, bytes]:
    """A chunk's hash but for when and where it arrived (a clock time, a transport entry id)."""
    fields = client.hgetall(KEYS.chunk(chunk_id))
    return {k: v for k, v in fields.items() if k not in (b"arrived_at", b"first_offset")}


def ingest_in_rounds(client, rounds, max_buffer_bytes: int, restart: bool, **worker_options) -> dict:
    """Publish and ingest each round in turn, with a new worker after each round or one throughout;
    returns what Redis holds then. A stopped worker left what a killed one would: each read_all
    ends with every batch committed."""
    client.flushall()
    worker = redis_worker(client, max_buffer_bytes, **worker_options)
    for records in rounds:
        publish(client, records)
        read_all(worker, client)
        if restart:
            worker.stop()
            worker = redis_worker(client, max_buffer_bytes, **worker_options)
    worker.stop()
    assert_parts_match_chunks(client)
    return {
        "dead": dead_letters(client),
        "ready": chunk_ids(client, KEYS.ready),
        "assembling": {c: chunk_fields(client, c) for c in chunk_ids(client, KEYS.assembling)},
        "ingest": client.hgetall(KEYS.ingest),
    }


@pytest.mark.integration
def test_a_restart_drops_the_same_incomplete_chunk_as_an_uninterrupted_ingest(redis_db) -> None:
    # Chunk 7's first part arrives before chunk 5's, in one poll; then chunk 6's needs room.
    rounds = [[records_of(7, n=3)[0], records_of(5, n=3)[0]], [records_of(6, n=3)[0]]]
    uninterrupted = ingest_in_rounds(redis_db, rounds, 2 * PART, restart=False)
    restarted = ingest_in_rounds(redis_db, rounds, 2 * PART, restart=True)
    assert restarted == uninterrupted
    assert [(reason, detail.split()[1]) for reason, detail in uninterrupted["dead"]] == [("size", "5")]
    assert list(uninterrupted["assembling"]) == [6, 7]


@pytest.mark.integration
def test_a_restart_keeps_skipping_a_refused_chunk_as_an_uninterrupted_ingest(redis_db) -> None:
    big, small = records_of(1, n=8), records_of(2, n=3)
    rounds = [
        big[:4],  # chunk 1 is refused at its first part: its 8 parts cannot fit the limit of 3
        [small[0], *big[4:], *small[1:]],  # chunk 1's later parts would drop chunk 2 if stored again
        big[:1],  # after chunk 2 completed, chunk 1 is behind the window: the order guard rejects it
    ]
    uninterrupted = ingest_in_rounds(redis_db, rounds, 3 * PART, restart=False, max_chunks_ahead=1)
    restarted = ingest_in_rounds(redis_db, rounds, 3 * PART, restart=True, max_chunks_ahead=1)
    assert restarted == uninterrupted
    assert [(reason, detail.split()[1]) for reason, detail in uninterrupted["dead"]] == [
        ("size", "1"),
        ("chunk_order", "1"),
    ]
    assert uninterrupted["ready"] == [2] and not uninterrupted["assembling"]
    assert uninterrupted["ingest"][b"refused_chunks"] == b""  # forgotten once chunk 2 completed
    ingest_in_rounds(redis_db, rounds[:1], 3 * PART, restart=False, max_chunks_ahead=1)
    assert redis_db.hget(KEYS.ingest, "refused_chunks") == b"1"


@pytest.mark.integration
def test_chunks_complete_in_any_order_and_a_restart_still_stores_a_re_sent_chunk_once(redis_db) -> None:
    second, first = records_of(2, n=3), records_of(1, n=3)
    rounds = [
        [second[0], first[0], *second[1:]],  # chunk 2 completes first
        first[1:],  # chunk 1 completes after it: valid data, stored
        [*second, first[0]],  # re-sent by a producer's retry: duplicates, stored once
    ]
    uninterrupted = ingest_in_rounds(redis_db, rounds, 1 << 30, restart=False)
    restarted = ingest_in_rounds(redis_db, rounds, 1 << 30, restart=True)
    assert restarted == uninterrupted
    assert uninterrupted["ready"] == [1, 2] and not uninterrupted["assembling"] and not uninterrupted["dead"]
    assert uninterrupted["ingest"][b"last_completed"] == b"2" and uninterrupted["ingest"][b"chunks_received"] == b"2"
    assert chunk_ids(redis_db, KEYS.completed) == [1, 2]


@pytest.mark.integration
def test_ingest_pauses_on_the_chunks_of_batches_it_has_not_committed_yet(redis_db) -> None:
    publish(redis_db, [record for chunk_id in (1, 2, 3, 4) for record in records_of(chunk_id, n=8)])
    worker = redis_worker(redis_db, max_buffer_bytes=8 * PART)
    gate = threading.Event()
    commit = worker.store.commit

    def held_commit(batch) -> None:
        gate.wait()
        commit(batch)

    worker.store.commit = held_commit  # the first poll's batch stays uncommitted for a while
    assert worker.step(timeout=0.2) == 16  # completes chunks 1 and 2: twice the limit
    release = threading.Timer(0.5, gate.set)
    release.start()
    # Redis does not hold the batch yet; the pause must count it all the same.
    assert worker.step(timeout=0.2) == 0 and worker.paused
    release.join()
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [1, 2] and redis_db.xlen(TRANSPORT) == 16


@pytest.mark.integration
def test_a_queued_count_that_included_incomplete_chunks_does_not_keep_ingest_paused(redis_db) -> None:
    redis_db.hset(KEYS.ingest, "queued_bytes", 1 << 40)  # as an earlier version may have left it, nothing ready
    publish(redis_db, records_of(1, n=3))
    worker = redis_worker(redis_db, max_buffer_bytes=1 << 30)
    read_all(worker, redis_db)
    worker.stop()
    assert chunk_ids(redis_db, KEYS.ready) == [1]
    assert int(redis_db.hget(KEYS.ingest, "queued_bytes")) == 3 * PART


@pytest.mark.integration
def test_a_committed_chunk_is_reported_though_the_transport_then_refuses_to_trim(tmp_path, redis_db) -> None:
    transport = RedisServer(tmp_path)
    transport.start()
    try:
        admin = transport.client()
        # A transport user that may read the stream but not trim it: acknowledging fails after the commit.
        admin.acl_setuser(
            "reader", enabled=True, nopass=True, categories=["+@all"], commands=["-xtrim", "-xdel"], keys=["*"]
        )
        reader = transport.client(username="reader", password="unused")
        publish(admin, records_of(1, n=3))
        received = metrics.CHUNKS_RECEIVED._value.get()
        ready_calls = []
        worker = redis_worker(redis_db, 1 << 30, reader, on_chunk_ready=lambda: ready_calls.append(1))
        deadline = time.monotonic() + 30
        with pytest.raises(redis.exceptions.NoPermissionError):
            while time.monotonic() < deadline:
                worker.step(timeout=0.2)
                worker.flush()
        assert chunk_ids(redis_db, KEYS.ready) == [1]
        assert ready_calls == [1] and metrics.CHUNKS_RECEIVED._value.get() == received + 1
        worker.stop()
        reader.close()
        admin.close()
    finally:
        transport.stop()


@pytest.mark.integration
def test_a_transport_outage_during_a_pause_is_reported(tmp_path, redis_db) -> None:
    transport = RedisServer(tmp_path)
    transport.start()
    try:
        client = transport.client()
        publish(client, records_of(1) + records_of(2) + records_of(3))
        board = OutageBoard(limit_seconds=float("inf"))
        worker = redis_worker(redis_db, len(records_of(1)) * PART, client, outages=board)
        while not worker.paused:
            worker.step(timeout=0.2)
        transport.stop()
        deadline = time.monotonic() + 30
        while not board.is_down(worker.source.server):
            assert time.monotonic() < deadline, "the transport outage was never reported"
            assert worker.step(timeout=0.2) == 0 and worker.paused
        worker.stop()
        client.close()
    finally:
        transport.stop()


@pytest.mark.integration
def test_a_transaction_that_failed_while_the_poll_failed_too_is_logged_at_the_resync(
    tmp_path, redis_server, redis_db, caplog
) -> None:
    """The poll's error is the one the ingest thread reports; the transaction's own is logged by resync."""
    transport = RedisServer(tmp_path)
    transport.start()
    redis_db.acl_setuser("no-zadd", enabled=True, nopass=True, categories=["+@all"], commands=["-zadd"], keys=["*"])
    buffer = redis_server.client(username="no-zadd", password="unused")
    transport_client = transport.client()
    try:
        publish(transport_client, records_of(1, n=3))
        worker = redis_worker(buffer, 1 << 30, transport_client)
        assert worker.step(timeout=0.2) == 3  # its transaction fails: ZADD is not allowed
        transport.stop()
        with pytest.raises(redis.ConnectionError):
            worker.step(timeout=0.2)
        with caplog.at_level(logging.WARNING, logger="alma_daemon.service.ingest.worker"):
            worker.resync()
        (logged,) = [r for r in caplog.records if r.name == "alma_daemon.service.ingest.worker"]
        assert logged.getMessage() == "ingest: a transaction failed; continuing from what Redis holds"
        assert "zadd" in logged.error.lower()
        worker.stop()
        assert not chunk_ids(redis_db, KEYS.assembling) and not redis_db.hgetall(KEYS.offsets)
    finally:
        buffer.close()
        transport_client.close()
        redis_db.acl_deluser("no-zadd")
        transport.stop()


class HeldSource(RedisStreamSource):
    """A transport whose poll blocks until released, as a Redis call may for up to 30 s."""

    def __init__(self, client) -> None:
        super().__init__(client, TRANSPORT)
        self.polling = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def poll(self, timeout: float, max_records: int):
        self.polling.set()
        self.release.wait()
        return super().poll(timeout, max_records)

    def close(self) -> None:
        self.closed = True


@pytest.mark.integration
def test_a_stop_that_outwaits_its_timeout_leaves_the_source_to_the_thread_still_polling(redis_db, caplog) -> None:
    source = HeldSource(redis_db)
    worker = IngestWorker(source, redis_db, KEYS, SCHEMA, IngestLimits(max_buffer_bytes=1 << 30))
    worker.start()
    try:
        assert source.polling.wait(30), "the ingest thread never polled"
        with caplog.at_level(logging.WARNING, logger="alma_daemon.service.ingest.worker"):
            worker.stop(timeout=0.1)
        assert worker.alive and not source.closed
        assert "ingest: the thread did not stop in time; its source is left open" in caplog.messages
    finally:
        source.release.set()
    worker.stop()
    assert not worker.alive and source.closed and worker.error is None
