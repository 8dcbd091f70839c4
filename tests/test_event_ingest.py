"""Event streams: labeled events cut into chunks every N examples or T seconds, the cut committed with them."""

from __future__ import annotations

import time

import pytest
import torch

from alma_daemon.data.events import EVENT_JSON, EVENT_ROWS, encode_events
from alma_daemon.data.wire import StreamSchema, WireRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.cutter import EventCutter, EventStream, OpenChunk
from alma_daemon.service.ingest.store import IngestBatch
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker
from alma_daemon.service.redis_buffer import ReadyChunks
from alma_daemon.transports.redis_stream import RedisStreamSource, encode_entry

STREAM = "events"
KEYS = StreamKeys(STREAM)
TRANSPORT = "alma.events"
SCHEMA = StreamSchema("labeled", (3,), num_classes=4)


def examples(n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(start * 3, (start + n) * 3, dtype=torch.float32).reshape(n, 3) % 255
    return x, torch.arange(start, start + n) % 4


# -- the cutter (pure logic) ----------------------------------------------------------------------
def test_a_chunk_is_cut_at_the_count_and_the_rest_opens_the_next_one() -> None:
    cutter = EventCutter(chunk_examples=4, chunk_seconds=None)
    batch = IngestBatch()
    cutter.add(*examples(10), now=5.0, batch=batch)
    assert [(s.chunk_id, s.part, s.examples) for s in batch.segments] == [(1, 0, 4), (2, 0, 4), (3, 0, 2)]
    assert {c: p.examples for c, p in batch.completed.items()} == {1: 4, 2: 4}
    assert (cutter.open.chunk_id, cutter.open.examples, cutter.open.parts, cutter.open.opened_at) == (3, 2, 1, 5.0)
    assert OpenChunk.from_fields(cutter.open.as_fields()) == cutter.open


def test_a_chunk_is_cut_once_its_first_example_is_chunk_seconds_old() -> None:
    cutter = EventCutter(chunk_examples=100, chunk_seconds=10.0)
    batch = IngestBatch()
    cutter.add(*examples(3), now=0.0, batch=batch)
    cutter.cut_if_due(9.9, batch)
    assert not batch.completed
    cutter.add(*examples(2), now=9.9, batch=batch)
    cutter.cut_if_due(10.0, batch)
    assert batch.completed[1].examples == 5 and batch.completed[1].parts == 2
    cutter.cut_if_due(100.0, batch)  # an empty open chunk is never cut
    assert list(batch.completed) == [1] and cutter.open == OpenChunk(chunk_id=2)


def test_an_event_stream_needs_a_count_or_a_period() -> None:
    with pytest.raises(ValueError, match="chunk_examples or stream.chunk_seconds"):
        EventCutter(chunk_examples=None, chunk_seconds=None)


# -- through ingest, against Redis ----------------------------------------------------------------
def event_worker(client, events: EventStream) -> IngestWorker:
    return IngestWorker(
        RedisStreamSource(client, TRANSPORT),
        client,
        KEYS,
        SCHEMA,
        IngestLimits(max_buffer_bytes=1 << 30),
        events=events,
    )


def publish(client, records: list[WireRecord]) -> None:
    for record in records:
        client.xadd(TRANSPORT, encode_entry(record))


def ingest_all(worker: IngestWorker, client, limit_seconds: float = 30) -> None:
    deadline = time.monotonic() + limit_seconds
    while client.xlen(TRANSPORT):
        assert time.monotonic() < deadline, "ingest stalled"
        worker.step(timeout=0.2)
        worker.flush()


def stored_chunks(client) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ready = ReadyChunks(client, KEYS)
    return [(c.data.x, c.data.y) for c in (ready.load(i) for i in ready.ids())]


def mixed_events() -> tuple[list[WireRecord], tuple[torch.Tensor, torch.Tensor]]:
    """23 examples: JSON events of one example, JSON of three, rows of four, and bad events among them."""
    x, y = examples(23)
    records = encode_events(x[:8], y[:8]) + encode_events(x[8:14], y[8:14], per_record=3)
    records += [WireRecord(None, b'{"x": [1, 2, NaN], "y": 1}', [("content-type", EVENT_JSON.encode())])]
    records += encode_events(x[14:22].to(torch.uint8), y[14:22], EVENT_ROWS, per_record=4)
    records += [WireRecord(None, b'{"x": [1, 2, 3], "y": 9}', [("content-type", EVENT_JSON.encode())])]
    records += encode_events(x[22:], y[22:])
    return records, (x, y)


@pytest.mark.integration
def test_events_of_every_form_are_cut_into_chunks_of_n_and_bad_events_are_dead_lettered(redis_db) -> None:
    records, (x, y) = mixed_events()
    publish(redis_db, records)
    worker = event_worker(redis_db, EventStream(chunk_examples=10, chunk_seconds=None))
    ingest_all(worker, redis_db)
    worker.stop()
    chunks = stored_chunks(redis_db)
    assert [len(cy) for _, cy in chunks] == [10, 10]
    assert torch.equal(torch.cat([cx for cx, _ in chunks]), x[:20]) and torch.equal(
        torch.cat([cy for _, cy in chunks]), y[:20]
    )
    reasons = [f[b"reason"].decode() for _, f in redis_db.xrange(KEYS.dead)]
    assert reasons == ["non_finite", "label_range"]
    ingest = redis_db.hgetall(KEYS.ingest)
    assert ingest[b"open_chunk"] == b"3" and ingest[b"open_examples"] == b"3"
    assert int(ingest[b"examples_received"]) == 20 and int(ingest[b"records_rejected"]) == 2


@pytest.mark.integration
def test_a_restarted_ingest_cuts_exactly_the_chunks_an_uninterrupted_one_cuts(redis_db) -> None:
    records, _ = mixed_events()
    events = EventStream(chunk_examples=7, chunk_seconds=None)

    def run(restart_every: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        redis_db.flushall()
        worker = event_worker(redis_db, events)
        for i in range(0, len(records), restart_every or len(records)):
            publish(redis_db, records[i : i + (restart_every or len(records))])
            ingest_all(worker, redis_db)
            worker.stop()  # what a kill leaves: every batch read so far is committed, nothing more
            worker = event_worker(redis_db, events)
        worker.stop()
        return stored_chunks(redis_db)

    uninterrupted, restarted = run(None), run(restart_every=2)
    assert len(uninterrupted) == 3
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(uninterrupted, restarted, strict=True)
    )


@pytest.mark.integration
def test_a_quiet_stream_still_cuts_its_open_chunk_after_chunk_seconds(redis_db) -> None:
    publish(redis_db, encode_events(*examples(3)))
    worker = event_worker(redis_db, EventStream(chunk_examples=None, chunk_seconds=0.5))
    ingest_all(worker, redis_db)
    deadline = time.monotonic() + 30
    while not redis_db.zcard(KEYS.ready):
        assert time.monotonic() < deadline, "the open chunk was never cut"
        worker.step(timeout=0.2)
        worker.flush()
    worker.stop()
    assert [len(cy) for _, cy in stored_chunks(redis_db)] == [3]
