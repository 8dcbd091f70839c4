"""Any producer, any topic: confluent-kafka (librdkafka) into a 4-partition topic at full speed, chunk
parts and labeled events, with the daemon killed mid-stream; every example is trained on, once."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Iterable

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.data.events import EVENT_JSON, EVENT_ROWS, encode_events
from alma_daemon.data.wire import WireRecord, encode_chunk
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.chunk_store import ChunkStore
from alma_daemon.service.redis_buffer import RedisBuffer
from alma_daemon.transports.replay import CHUNK_SOURCES, dataset_chunks
from tests.helpers.daemon import engine_state, finish, service_config, sigkill, start_daemon, wait_until, write_config

PARTITIONS = 4
CHUNKS = 6
EXAMPLES = 900  # 6 chunks of 150 MNIST examples


def produce(bootstrap_servers: str, topic: str, records: Iterable[WireRecord], partitions: set[int]) -> None:
    """Send as fast as librdkafka takes them, with its default partitioner; fail on any delivery error.
    ``partitions`` receives the partitions the records went to."""
    from confluent_kafka import Producer

    failed: list[str] = []

    def delivered(err, msg) -> None:
        if err:
            failed.append(str(err))
        else:
            partitions.add(msg.partition())

    # Keyless records stick to one partition per 10 ms batch by default (librdkafka's sticky
    # partitioner): a fast, short run could send them all to one. 0 picks a partition per record.
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "sticky.partitioning.linger.ms": 0}
    )
    for record in records:
        producer.produce(topic, key=record.key, value=record.value, headers=record.headers, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed


def rows(x: torch.Tensor, y: torch.Tensor) -> Counter:
    """The examples as a multiset of (pixels, label): partitions may reorder events, never change them."""
    return Counter((bytes(xi.to(torch.uint8).flatten().tolist()), int(yi)) for xi, yi in zip(x, y, strict=True))


def buffered_rows(client, keys: StreamKeys, tmp_path) -> tuple[list[int], Counter]:
    """The kept chunks and their examples, read from the daemon's chunk store (``run_killed_mid_stream``'s)."""
    store = ChunkStore.for_config(build_config(service_config(tmp_path, None, keys.stream)))
    buffer = RedisBuffer(client, keys, store)
    found: Counter = Counter()
    for chunk_id in buffer.kept_chunks():
        split = buffer.split(chunk_id)
        for part in (split.train, split.val):
            found += rows(part.x, part.y)
    return buffer.kept_chunks(), found


def run_killed_mid_stream(
    tmp_path, kafka_broker, redis_server, redis_db, name: str, records, dead: int = 0, **sections
) -> dict:
    """Produce ``records`` into a new 4-partition topic while the daemon runs; kill -9 it once two chunks
    are in, restart it until it has taken every chunk; return its engine state. ``dead``: the records
    that must end in the dead letters; ``sections``: config sections besides the test's own."""
    data = service_config(
        tmp_path,
        redis_server.url,
        name,
        stream={"megabatches": CHUNKS, "train_examples": EXAMPLES, "replay": True, **sections.pop("stream", {})},
        kafka={"transport": "kafka", "bootstrap_servers": kafka_broker.bootstrap_servers, "topic": f"alma.{name}"},
        daemon={"reorder_wait_seconds": 5.0},
        **sections,
    )
    config_path = write_config(tmp_path, data)
    kafka_broker.create_topic(f"alma.{name}", PARTITIONS)
    keys = StreamKeys(name)
    daemon = start_daemon(config_path)
    wait_until(lambda: redis_db.hget(keys.daemon, "phase") == b"waiting", "waiting", daemon)
    partitions: set[int] = set()
    producer = threading.Thread(
        target=produce, args=(kafka_broker.bootstrap_servers, f"alma.{name}", records, partitions)
    )
    producer.start()
    wait_until(lambda: int(redis_db.hget(keys.ingest, "chunks_received") or 0) >= 2, "two chunks in", daemon)
    sigkill(daemon)
    producer.join()
    assert len(partitions) > 1, "every record went to one partition: nothing to reorder"
    finish(start_daemon(config_path, "--until-chunks", str(CHUNKS)))
    assert redis_db.xlen(keys.dead) == dead, redis_db.xrange(keys.dead)
    return engine_state(redis_db, name)


def named_label(record: WireRecord, classes: tuple[str, ...]) -> WireRecord:
    """A JSON event with its label written as the class's name."""
    event = json.loads(record.value)
    return dataclasses.replace(record, value=json.dumps({**event, "y": classes[event["y"]]}).encode())


def mnist(tmp_path) -> tuple[torch.Tensor, torch.Tensor, list]:
    config = build_config(
        service_config(tmp_path, None, "x", stream={"megabatches": CHUNKS, "train_examples": EXAMPLES})
    )
    chunks = list(dataset_chunks(config))
    return torch.cat([c.tensors["x"] for c in chunks]), torch.cat([c.tensors["y"] for c in chunks]), chunks


@pytest.mark.integration
@pytest.mark.slow
def test_chunks_spread_over_four_partitions_are_all_trained_on_once_in_id_order(
    tmp_path, kafka_broker, redis_server, redis_db
) -> None:
    x, y, chunks = mnist(tmp_path)
    # ~20 KB parts, 6 a chunk; the key <stream>/<chunk> puts each chunk on one partition, and the
    # default partitioner spreads the chunks over all four.
    records = [
        r
        for c in chunks
        for r in encode_chunk("spread", c.chunk_id, c.tensors["x"], c.tensors["y"], max_part_bytes=20_000)
    ]
    state = run_killed_mid_stream(tmp_path, kafka_broker, redis_server, redis_db, "spread", records)
    assert state["chunks_seen"] == CHUNKS
    kept, found = buffered_rows(redis_db, StreamKeys("spread"), tmp_path)
    assert kept == list(range(1, CHUNKS + 1)) and found == rows(x, y)
    taken = [row["chunk"] for row in state["series"]]
    assert sorted(taken) == kept
    # Out of id order only where a chunk completed after the 5 s wait: then it is a recorded late step.
    late = [row["chunk"] for row in state["series"] if row.get("late")]
    assert state["late_chunks"] == len(late)
    assert [c for c in taken if c not in late] == sorted(c for c in taken if c not in late)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("content_type", [EVENT_JSON, EVENT_ROWS])
def test_labeled_events_from_four_partitions_are_cut_into_chunks_and_each_trained_on_once(
    tmp_path, kafka_broker, redis_server, redis_db, content_type
) -> None:
    x, y, _ = mnist(tmp_path)
    per_record = 1 if content_type == EVENT_JSON else 5
    records = encode_events(x, y, content_type, per_record=per_record)  # no key: spread over the partitions
    stream = "events-json" if content_type == EVENT_JSON else "events-rows"
    state = run_killed_mid_stream(
        tmp_path, kafka_broker, redis_server, redis_db, stream, records, stream={"chunk_examples": EXAMPLES // CHUNKS}
    )
    assert state["chunks_seen"] == CHUNKS and state["late_chunks"] == 0
    kept, found = buffered_rows(redis_db, StreamKeys(stream), tmp_path)
    assert kept == list(range(1, CHUNKS + 1)) and found == rows(x, y)
    assert int(redis_db.hget(StreamKeys(stream).ingest, "examples_received")) == EXAMPLES


@pytest.mark.integration
@pytest.mark.slow
def test_a_teams_features_as_events_from_four_partitions_train_its_model_once_and_bad_events_are_counted(
    tmp_path, kafka_broker, redis_server, redis_db
) -> None:
    pytest.importorskip("river", reason="River is not installed: pip install -e '.[river]' (CI installs it)")
    river = {"name": "river", "river_stream": "agrawal", "river_examples": 1000, "test_examples": 100}
    config = build_config(
        service_config(tmp_path, None, "x", dataset=river, stream={"megabatches": CHUNKS, "train_examples": EXAMPLES})
    )
    chunks = list(CHUNK_SOURCES["river"](config))
    x, y = torch.cat([c.tensors["x"] for c in chunks]), torch.cat([c.tensors["y"] for c in chunks])
    assert float(x.max()) > 255  # salaries: features no pixel stream would take
    bad = [
        *encode_events(x[:1, :-1].contiguous(), y[:1], EVENT_JSON),  # one feature short: "shape"
        *encode_events(x[:1], torch.tensor([7]), EVENT_JSON),  # a class Agrawal lacks: "label_range"
    ]
    # The team's producer labels its events by name (task.classes), as its own systems call them.
    records = [named_label(r, ("deny", "grant")) for r in encode_events(x, y, EVENT_JSON)]
    records[len(records) // 3 : len(records) // 3] = bad
    state = run_killed_mid_stream(
        tmp_path,
        kafka_broker,
        redis_server,
        redis_db,
        "features",
        records,
        dead=len(bad),
        dataset=river,
        stream={"chunk_examples": EXAMPLES // CHUNKS},
        learner={"name": "sm", "model": "tests.helpers.user_models:tabular_mlp"},
        task={"classes": ["deny", "grant"], "measure": "recall"},
    )
    assert state["chunks_seen"] == CHUNKS and state["late_chunks"] == 0
    series = [json.loads(row) for row in redis_db.lrange(StreamKeys("features").series, 0, -1)]
    assert {"prequential_recall", "cumulative_recall", "test_measures"} <= set(series[-1])
    kept, found = buffered_rows(redis_db, StreamKeys("features"), tmp_path)
    assert kept == list(range(1, CHUNKS + 1)) and found == rows(x, y)
    reasons = {fields[b"reason"] for _, fields in redis_db.xrange(StreamKeys("features").dead)}
    assert reasons == {b"shape", b"label_range"}
