"""Wire records of tiny chunks (valid and one per rejection reason) and Kafka ingest helpers."""

from __future__ import annotations

import itertools
import pickle
import time

import safetensors.torch
import torch

from alma_daemon.data.wire import (
    HEADER_PART,
    HEADER_SCHEMA,
    HEADER_STREAM,
    MAX_ID,
    StreamSchema,
    WireRecord,
    decode_record,
    encode_chunk,
)
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker

STREAM = "tiny"


SCHEMA = StreamSchema("labeled", (4, 4), num_classes=3, max_part_bytes=4096)


#: Small parts, so a chunk of 40 examples travels as several records.
PART_BYTES = 400


_topics = itertools.count()


def tiny_chunk(chunk_id: int, n: int = 40, shape: tuple[int, ...] = (4, 4), classes: int = 3):
    g = torch.Generator().manual_seed(chunk_id)
    return (
        torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8),
        torch.randint(0, classes, (n,), generator=g),
    )


def records_of(
    chunk_id: int,
    n: int = 40,
    stream: str = STREAM,
    shape: tuple[int, ...] = (4, 4),
    classes: int = 3,
    max_part_bytes: int = PART_BYTES,
) -> list[WireRecord]:
    x, y = tiny_chunk(chunk_id, n, shape, classes)
    return encode_chunk(stream, chunk_id, x, y, max_part_bytes=max_part_bytes)


def with_header(record: WireRecord, name: str, value: bytes | None) -> WireRecord:
    headers = [(k, v) for k, v in record.headers if k != name]
    if value is not None:
        headers.append((name, value))
    return WireRecord(record.key, record.value, headers)


def with_value(record: WireRecord, tensors: dict[str, torch.Tensor]) -> WireRecord:
    return WireRecord(record.key, safetensors.torch.save(tensors), record.headers)


def bad_records(
    stream: str = STREAM, shape: tuple[int, ...] = (4, 4), classes: int = 3, max_part_bytes: int = SCHEMA.max_part_bytes
) -> dict[str, WireRecord]:
    """One record per rejection reason, built from a valid part of chunk 7 (chunk 0 for the order check,
    whose ids start at 1; a valid one-part chunk with the largest id for the bound on ids ahead)."""
    x, y = tiny_chunk(7, 4, shape, classes)
    good = encode_chunk(stream, 7, x, y)[0]
    nan = x.float()
    nan[0].view(-1)[0] = float("nan")
    normalized = x.float() / 255 - 0.5  # features already standardized: not raw units
    too_many = max_part_bytes // x[0].numel() + 1
    return {
        "schema": with_header(good, HEADER_SCHEMA, b"2"),
        "headers": with_header(good, HEADER_PART, None),
        "stream": WireRecord(
            b"other/7", good.value, [(k, b"other" if k == HEADER_STREAM else v) for k, v in good.headers]
        ),
        "part_numbering": with_header(good, HEADER_PART, b"5"),
        "size": with_value(
            good, {"x": torch.zeros(too_many, *shape, dtype=torch.uint8), "y": torch.zeros(too_many, dtype=torch.int64)}
        ),
        "decode": WireRecord(good.key, pickle.dumps({"x": [1, 2, 3]}), good.headers),
        "dtype": with_value(good, {"x": x.to(torch.int16), "y": y}),
        "shape": with_value(good, {"x": x.reshape(4, -1)[:, :-1].contiguous(), "y": y}),
        "label_range": with_value(good, {"x": x, "y": y + classes}),
        "non_finite": with_value(good, {"x": nan, "y": y}),
        "value_range": with_value(good, {"x": normalized, "y": y}),
        "chunk_order": encode_chunk(stream, 0, x, y)[0],
        "chunk_ahead": encode_chunk(stream, MAX_ID, x, y)[0],
    }


def decoded(records: list[WireRecord]):
    return [decode_record(r.key, r.value, r.headers, SCHEMA, STREAM) for r in records]


def publish_kafka(broker, topic: str, records: list[WireRecord]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    try:
        for r in records:
            producer.send(topic, key=r.key, value=r.value, headers=r.headers).get(timeout=30)
    finally:
        producer.close()


def kafka_worker(broker, topic: str, client, **kwargs) -> IngestWorker:
    from alma_daemon.transports.kafka import KafkaSource

    return IngestWorker(
        KafkaSource(broker.bootstrap_servers, topic),
        client,
        StreamKeys(STREAM),
        SCHEMA,
        IngestLimits(max_buffer_bytes=1 << 30),
        **kwargs,
    )


def drain(worker: IngestWorker, client, offset_reached: dict[str, str], limit_seconds: float = 60) -> None:
    """Step until the stored offsets reach ``offset_reached`` (a safety limit, not a timing check)."""
    keys = StreamKeys(STREAM)
    deadline = time.monotonic() + limit_seconds
    while True:
        stored = {k.decode(): v.decode() for k, v in client.hgetall(keys.offsets).items()}
        if all(stored.get(p) == o for p, o in offset_reached.items()):
            return
        assert time.monotonic() < deadline, f"offsets {stored} never reached {offset_reached}"
        worker.step(timeout=0.5)


def new_topic(broker) -> str:
    topic = f"ingest-{next(_topics)}"
    broker.create_topic(topic)
    return topic
