"""Ingest: assembling parts (pure), and Kafka / Redis-stream -> Redis exactly once, with dead letters."""

from __future__ import annotations

import threading
import time

import pytest
import redis
import torch

from alma_daemon import metrics
from alma_daemon.config import Config
from alma_daemon.data.wire import (
    MAX_ID,
    REJECT_REASONS,
    DecodedPart,
    RejectedRecord,
)
from alma_daemon.data.wire_format import DEFAULT_MAX_CHUNKS_AHEAD
from alma_daemon.infra.outages import OutageBoard
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.assembler import Assembler
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker
from alma_daemon.service.redis_buffer import ReadyChunks
from alma_daemon.transports.redis_stream import RedisStreamSource, encode_entry
from tests.helpers.records import (
    SCHEMA,
    STREAM,
    bad_records,
    decoded,
    drain,
    kafka_worker,
    new_topic,
    publish_kafka,
    records_of,
    tiny_chunk,
)
from tests.helpers.servers import KafkaBroker, RedisServer

# -- the assembler (pure logic) -------------------------------------------------------------------


def test_assembler_completes_a_chunk_once_and_ignores_duplicates() -> None:
    parts = decoded(records_of(1))
    assert len(parts) > 2
    assembler = Assembler(STREAM)
    outcomes = [assembler.accept(p, 100) for p in parts[:-1]]
    assert all(o.store and not o.completed for o in outcomes)
    assert not assembler.accept(parts[0], 100).store
    last = assembler.accept(parts[-1], 100)
    assert last.completed is not None and last.completed.examples == 40 and last.completed.parts == len(parts)
    assert assembler.last_completed == 1 and not assembler.in_progress
    assert not assembler.accept(parts[1], 100).store


def test_assembler_takes_chunks_in_any_order_but_each_once_and_rejects_contradicting_parts() -> None:
    assembler = Assembler(STREAM, completed=[3], max_ahead=10)
    outcomes = [assembler.accept(part, 100) for part in decoded(records_of(2))]
    assert outcomes[-1].completed is not None and assembler.last_completed == 3  # late, still stored
    assert not any(assembler.accept(part, 100).store for part in decoded(records_of(2) + records_of(3)))
    first = decoded(records_of(5))[0]
    assembler.accept(first, 100)
    other_count = decoded(records_of(5, n=4))[0]
    with pytest.raises(RejectedRecord) as numbering:
        assembler.accept(other_count, 100)
    assert numbering.value.reason == "part_numbering"
    x, y = tiny_chunk(5, n=2)
    floats = DecodedPart(STREAM, 5, 1, first.parts, x=x.float(), y=y)
    with pytest.raises(RejectedRecord) as dtype:
        assembler.accept(floats, 100)
    assert dtype.value.reason == "dtype"


def test_a_part_far_ahead_is_rejected_unstored_and_the_next_chunks_complete() -> None:
    """A valid one-part chunk with an id near 2**53 would complete at once; every later chunk would then
    be older than the newest completed one and be rejected for good."""
    assembler = Assembler(STREAM, completed=[3], max_ahead=1000)
    with pytest.raises(RejectedRecord) as ahead:
        assembler.accept(decoded(records_of(MAX_ID, n=4, max_part_bytes=4096))[0], 100)
    assert ahead.value.reason == "chunk_ahead"
    assert not assembler.in_progress and assembler.bytes == 0 and assembler.last_completed == 3
    for chunk_id in (4, 5):
        outcomes = [assembler.accept(part, 100) for part in decoded(records_of(chunk_id))]
        assert outcomes[-1].completed is not None
    assert assembler.last_completed == 5
    # An ingest worker built without the config bounds ids as the daemon's default does.
    assert Config().daemon.max_chunks_ahead == DEFAULT_MAX_CHUNKS_AHEAD


def test_an_incomplete_chunk_is_kept_until_the_window_passes_it_then_abandoned_and_refused() -> None:
    assembler = Assembler(STREAM, max_ahead=3)
    older = decoded(records_of(1))
    assembler.accept(older[0], 100)
    for chunk_id in (2, 3):
        assert [assembler.accept(part, 100) for part in decoded(records_of(chunk_id))][-1].dropped == {}
    assert set(assembler.in_progress) == {1}  # chunk 1 may still complete, late
    outcome = [assembler.accept(part, 100) for part in decoded(records_of(4))][-1]
    assert outcome.completed is not None and list(outcome.dropped) == [1]
    progress, why = outcome.dropped[1]
    assert progress.got == {0} and why.reason == "part_numbering"
    assert why.detail.startswith("chunk 1 has 1 of ") and "chunk 4 completed, 3 ids later" in why.detail
    assert not assembler.in_progress and assembler.window_floor == 2
    with pytest.raises(RejectedRecord) as behind:
        assembler.accept(older[1], 100)
    assert behind.value.reason == "chunk_order" and "3 ids behind chunk 4" in behind.value.detail
    assert assembler.accept(decoded(records_of(2))[0], 100).store is False  # in the window: a duplicate


# -- Kafka and Redis streams into Redis (real servers) ---------------------------------------------


@pytest.mark.integration
def test_kafka_parts_are_stored_once_and_a_restart_continues_from_the_stored_offsets(kafka_broker, redis_db) -> None:
    topic = new_topic(kafka_broker)
    first, second = records_of(1), records_of(2)
    resent = first[:2]  # a producer retry: the same parts again
    publish_kafka(kafka_broker, topic, first + resent + second)
    sent = len(first) + len(resent) + len(second)
    worker = kafka_worker(kafka_broker, topic, redis_db)
    drain(worker, redis_db, {"0": str(sent)})
    worker.stop()

    keys = StreamKeys(STREAM)
    ready = ReadyChunks(redis_db, keys)
    assert [int(c) for c in redis_db.zrange(keys.ready, 0, -1)] == [1, 2]
    for chunk_id in (1, 2):
        x, y = tiny_chunk(chunk_id)
        chunk = ready.load(chunk_id)
        assert torch.equal(chunk.data.x, x) and torch.equal(chunk.data.y, y)
    ingest = redis_db.hgetall(keys.ingest)
    assert int(ingest[b"chunks_received"]) == 2 and int(ingest[b"examples_received"]) == 80
    assert int(ingest[b"queued_bytes"]) == sum(len(r.value) for r in first + second)
    assert redis_db.xlen(keys.dead) == 0

    # A restarted consumer seeks to the stored offset: nothing is read twice, new records are.
    publish_kafka(kafka_broker, topic, records_of(3))
    restarted = kafka_worker(kafka_broker, topic, redis_db)
    drain(restarted, redis_db, {"0": str(sent + len(records_of(3)))})
    restarted.stop()
    assert [int(c) for c in redis_db.zrange(keys.ready, 0, -1)] == [1, 2, 3]
    assert int(redis_db.hget(keys.ingest, "chunks_received")) == 3
    assert redis_db.xlen(keys.dead) == 0  # a re-read from the start would dead-letter chunk 1's parts


def wait_for(condition, what: str, worker: IngestWorker, limit_seconds: float = 60) -> None:
    """Wait until ``condition()`` while the ingest thread lives (a safety limit, not a timing check)."""
    deadline = time.monotonic() + limit_seconds
    while not condition():
        assert worker.alive, f"the ingest thread ended before {what}: {worker.error!r}"
        assert time.monotonic() < deadline, f"no {what} within {limit_seconds} s"
        time.sleep(0.1)


@pytest.mark.integration
def test_a_topic_description_waits_for_a_missing_topic_and_reports_other_errors() -> None:
    from kafka.errors import TopicAuthorizationFailedError

    from alma_daemon.transports.kafka import KafkaSource, TopicNotServed, partitions_of

    def described(code: int, partitions: tuple[int, ...] = ()) -> dict:
        return {"error_code": code, "partitions": [{"partition_index": p} for p in partitions]}

    assert partitions_of(described(0, (1, 0)), "t") == [0, 1]
    assert partitions_of(described(3), "t") == []  # UNKNOWN_TOPIC_OR_PARTITION: not created yet
    assert partitions_of(described(5), "t") == []  # LEADER_NOT_AVAILABLE: being created
    # NOT_CONTROLLER is retriable but says nothing about the topic: an outage, not "no topic yet".
    with pytest.raises(TopicNotServed, match="NotControllerError") as raised:
        partitions_of(described(41), "t")
    assert isinstance(raised.value, KafkaSource.unreachable)
    with pytest.raises(TopicAuthorizationFailedError, match="kafka.topic"):
        partitions_of(described(29), "t")


@pytest.mark.integration
def test_a_broker_lost_before_the_topic_exists_is_reported_and_the_topic_is_read_once_it_comes(
    tmp_path, redis_db
) -> None:
    """Waiting for a topic asks the broker with bounded requests that never create it: while no broker
    answers, the ingest thread keeps stepping and reports Kafka down, and once the broker is back with
    the topic, the same source reads it."""
    from kafka.admin import KafkaAdminClient

    from alma_daemon.transports.kafka import KafkaSource

    broker = KafkaBroker(tmp_path / "tansu")
    broker.start()
    topic = "arrives-late"
    outages = OutageBoard(limit_seconds=float("inf"))
    keys = StreamKeys(STREAM)
    source = KafkaSource(broker.bootstrap_servers, topic)
    worker = IngestWorker(source, redis_db, keys, SCHEMA, IngestLimits(max_buffer_bytes=1 << 30), outages=outages)
    try:
        assert worker.step(timeout=0.2) == 0
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            assert topic not in admin.list_topics()  # asking for it did not create it
        finally:
            admin.close()
        broker.stop()
        worker.start()
        wait_for(lambda: outages.is_down("kafka"), "Kafka reported down", worker)
        broker.start()  # same port, empty: the topic is made now
        broker.create_topic(topic, partitions=2)
        publish_kafka(broker, topic, records_of(1))
        wait_for(lambda: redis_db.zrange(keys.ready, 0, -1) == [b"1"], "chunk 1 ready", worker)
        wait_for(lambda: not outages.is_down("kafka"), "Kafka reported back", worker)
        assert [tp.partition for tp in source.partitions] == [0, 1]
    finally:
        worker.stop()
        broker.stop()
    assert not worker.alive and worker.error is None


def kafka_io_threads() -> int:
    return sum(thread.name.startswith("kafka-io") for thread in threading.enumerate())


@pytest.mark.integration
def test_ingest_started_before_its_broker_reports_kafka_down_then_reads_the_topic(tmp_path, redis_db) -> None:
    """A daemon may start before its broker (Kubernetes orders nothing): the source connects on its
    first polls, reports the outage meanwhile, and tries no client while no broker accepts connections
    (a client that fails to bootstrap leaks its I/O thread)."""
    from alma_daemon.transports.kafka import DISCOVERY_INTERVAL, KafkaSource

    broker = KafkaBroker(tmp_path / "tansu")  # its port is chosen, nothing listens on it yet
    topic = "broker-comes-later"
    outages = OutageBoard(limit_seconds=float("inf"))
    keys = StreamKeys(STREAM)
    threads_before = kafka_io_threads()
    source = KafkaSource(broker.bootstrap_servers, topic)
    worker = IngestWorker(source, redis_db, keys, SCHEMA, IngestLimits(max_buffer_bytes=1 << 30), outages=outages)
    try:
        worker.start()
        wait_for(lambda: outages.is_down("kafka"), "Kafka reported down", worker)
        time.sleep(2 * DISCOVERY_INTERVAL)  # more tries at the broker, none of which may leave a thread
        assert kafka_io_threads() == threads_before
        assert "no Kafka broker accepts connections" in outages.outages()[0].reason
        broker.start()
        broker.create_topic(topic)
        publish_kafka(broker, topic, records_of(1))
        wait_for(lambda: redis_db.zrange(keys.ready, 0, -1) == [b"1"], "chunk 1 ready", worker)
        wait_for(lambda: not outages.is_down("kafka"), "Kafka reported back", worker)
    finally:
        worker.stop()
        broker.stop()
    assert not worker.alive and worker.error is None
    assert kafka_io_threads() == threads_before


class SnapshotRedis(RedisServer):
    """Redis that keeps only what ``SAVE`` wrote: a kill loses every write since, as a restart from an
    older snapshot (or the last second of an ``everysec`` AOF) does."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--appendonly") + 1] = "no"
        return command


@pytest.mark.integration
def test_a_redis_that_restarts_without_its_last_writes_gets_them_again_from_the_transport(
    kafka_broker, tmp_path
) -> None:
    """The ingest thread notices the restart itself (the server's run id), though no error reached it."""
    server = SnapshotRedis(tmp_path)
    server.start()
    try:
        client = server.client()
        keys = StreamKeys(STREAM)
        topic = new_topic(kafka_broker)
        publish_kafka(kafka_broker, topic, records_of(1))
        worker = kafka_worker(kafka_broker, topic, client)
        drain(worker, client, {"0": str(len(records_of(1)))})
        worker.flush()
        client.save()
        publish_kafka(kafka_broker, topic, records_of(2))
        sent = len(records_of(1)) + len(records_of(2))
        drain(worker, client, {"0": str(sent)})
        worker.flush()
        assert [int(c) for c in client.zrange(keys.ready, 0, -1)] == [1, 2]

        server.kill()
        server.start()
        assert [int(c) for c in client.zrange(keys.ready, 0, -1)] == [1]  # chunk 2 is lost
        publish_kafka(kafka_broker, topic, records_of(3))
        sent += len(records_of(3))
        deadline = time.monotonic() + 60
        while {k.decode(): v.decode() for k, v in client.hgetall(keys.offsets).items()}.get("0") != str(sent):
            assert time.monotonic() < deadline, "ingest never stored the last offsets"
            try:
                worker.step(timeout=0.5)
                worker.flush()
            except redis.ConnectionError:
                worker.resync()  # what the ingest thread does after such an error
        assert [int(c) for c in client.zrange(keys.ready, 0, -1)] == [1, 2, 3]
        assert client.xlen(keys.dead) == 0 and int(client.hget(keys.ingest, "chunks_received")) == 3
        worker.stop()
        client.close()
    finally:
        server.stop()


@pytest.mark.integration
def test_each_kind_of_bad_record_is_dead_lettered_and_ingestion_continues(kafka_broker, redis_db) -> None:
    topic = new_topic(kafka_broker)
    bad = bad_records()
    # "fields" is an event's reason (tests/test_events.py): a chunk part has no fields to miss; "incomplete"
    # is a whole chunk's, given up in time (tests/test_incomplete_chunks.py).
    assert set(bad) == set(REJECT_REASONS) - {"fields", "incomplete"}, "a rejection reason has no bad record here"
    before = {reason: metrics.RECORDS_REJECTED.labels(reason)._value.get() for reason in bad}
    # Chunk 3 completes first, so the part of chunk 2 among the bad records arrives out of order.
    stream = records_of(3) + list(bad.values()) + records_of(4)
    publish_kafka(kafka_broker, topic, stream)
    worker = kafka_worker(kafka_broker, topic, redis_db)
    drain(worker, redis_db, {"0": str(len(stream))})
    worker.stop()

    keys = StreamKeys(STREAM)
    dead = redis_db.xrange(keys.dead)
    assert sorted(fields[b"reason"].decode() for _, fields in dead) == sorted(bad)
    assert all(fields[b"detail"] and fields[b"origin"].startswith(topic.encode()) for _, fields in dead)
    assert [int(c) for c in redis_db.zrange(keys.ready, 0, -1)] == [3, 4]
    assert int(redis_db.hget(keys.ingest, "records_rejected")) == len(bad)
    for reason in bad:
        assert int(redis_db.hget(keys.ingest, f"rejected:{reason}")) == 1
        assert metrics.RECORDS_REJECTED.labels(reason)._value.get() == before[reason] + 1


@pytest.mark.integration
def test_redis_stream_transport_stores_parts_and_trims_what_it_stored(redis_db) -> None:
    transport = "alma.tiny"
    entries = records_of(1) + records_of(1)[:1] + records_of(2)
    for record in entries:
        redis_db.xadd(transport, encode_entry(record))
    redis_db.xadd(transport, {"key": b"tiny/9", "value": b"", "headers": b"not json"})
    keys = StreamKeys(STREAM)
    worker = IngestWorker(
        RedisStreamSource(redis_db, transport), redis_db, keys, SCHEMA, IngestLimits(max_buffer_bytes=1 << 30)
    )
    deadline = time.monotonic() + 30
    while redis_db.xlen(transport) and time.monotonic() < deadline:
        worker.step(timeout=0.2)
    assert redis_db.xlen(transport) == 0
    assert [int(c) for c in redis_db.zrange(keys.ready, 0, -1)] == [1, 2]
    assert [f[b"reason"] for _, f in redis_db.xrange(keys.dead)] == [b"headers"]

    # A restart reads nothing twice: the stored offset is the last entry id.
    for record in records_of(3):
        redis_db.xadd(transport, encode_entry(record))
    restarted = IngestWorker(
        RedisStreamSource(redis_db, transport), redis_db, keys, SCHEMA, IngestLimits(max_buffer_bytes=1 << 30)
    )
    while redis_db.xlen(transport) and time.monotonic() < deadline:
        restarted.step(timeout=0.2)
    assert [int(c) for c in redis_db.zrange(keys.ready, 0, -1)] == [1, 2, 3]
    assert int(redis_db.hget(keys.ingest, "chunks_received")) == 3


@pytest.mark.integration
def test_ingest_pauses_while_the_buffer_is_full(redis_db) -> None:
    transport = "alma.tiny"
    for chunk_id in (1, 2, 3):
        for record in records_of(chunk_id):
            redis_db.xadd(transport, encode_entry(record))
    keys = StreamKeys(STREAM)
    one_chunk = sum(len(r.value) for r in records_of(1))
    worker = IngestWorker(
        RedisStreamSource(redis_db, transport), redis_db, keys, SCHEMA, IngestLimits(max_buffer_bytes=one_chunk)
    )
    while not worker.paused:
        worker.step(timeout=0.2)
    worker.flush()
    queued = int(redis_db.hget(keys.ingest, "queued_bytes"))
    assert queued > one_chunk
    assert worker.step(timeout=0.2) == 0 and int(redis_db.hget(keys.ingest, "queued_bytes")) == queued

    ready = ReadyChunks(redis_db, keys)
    while ready_ids := ready.ids():
        chunk_id = ready_ids[0]  # the engine consumes what is ready
        pipe = redis_db.pipeline(transaction=True)
        ready.stage_consume(pipe, chunk_id)
        pipe.execute()
    assert worker.step(timeout=0.2) > 0 and not worker.paused
