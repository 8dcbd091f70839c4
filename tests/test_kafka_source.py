"""KafkaSource against a real broker when Kafka hands it something other than good records: a record
kafka-python cannot parse, a stored offset the broker no longer holds, an offset reset that cannot
complete.

Tansu answers a fetch past the log end with no records where Kafka answers OFFSET_OUT_OF_RANGE, and
always knows a partition's earliest offset, so those tests put :class:`RewritingProxy` between the
consumer and Tansu: it edits the answers to one kind of request on the wire.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

from alma_daemon import metrics
from alma_daemon.data.wire import WireRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.transports.kafka import KafkaSource
from tests.helpers.records import STREAM, drain, kafka_worker, new_topic, publish_kafka, records_of
from tests.helpers.servers import LOOPBACK, KafkaBroker, free_port

OFFSET_OUT_OF_RANGE = 1
LEADER_NOT_AVAILABLE = 5
EARLIEST = -2

#: How a :class:`RewritingProxy` edits one kind of answer: ``edit(request, response)`` changes the
#: decoded response in place.
Rewrite = Callable[[Any, Any], None]


class RewritingProxy:
    """A TCP relay in front of a broker that decodes the requests of the kinds in ``rewrites`` (by
    request class) and lets ``rewrites[kind]`` edit their answers; every other byte passes unchanged.
    It runs its own event loop in a thread of the test process."""

    def __init__(self, port: int, broker_port: int, rewrites: dict[Any, tuple[Any, Rewrite]]) -> None:
        self.port = port
        self.broker_port = broker_port
        self.rewrites = {request.API_KEY: (request, response, edit) for request, (response, edit) in rewrites.items()}
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connect, LOOPBACK, self.port))
        started.set()
        self.loop.run_forever()

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        broker_reader, broker_writer = await asyncio.open_connection(LOOPBACK, self.broker_port)
        awaited: dict[int, tuple[Any, Any, Rewrite]] = {}  # correlation id -> (request, response class, edit)

        async def requests() -> None:
            while frame := await read_frame(client_reader, broker_writer):
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if api_key in self.rewrites:
                    request_class, response_class, edit = self.rewrites[api_key]
                    request = request_class.decode(frame, version=version, header=True)
                    awaited[correlation_id] = (request, response_class, edit)
                broker_writer.write(framed(frame))

        async def responses() -> None:
            while frame := await read_frame(broker_reader, client_writer):
                (correlation_id,) = struct.unpack_from(">i", frame)
                if correlation_id in awaited:
                    request, response_class, edit = awaited.pop(correlation_id)
                    response = response_class.decode(frame, version=request.API_VERSION, header=True)
                    edit(request, response)
                    frame = response.encode(header=True)
                client_writer.write(framed(frame))

        await asyncio.gather(requests(), responses())


async def read_frame(reader: asyncio.StreamReader, peer: asyncio.StreamWriter) -> bytes:
    """The next size-prefixed Kafka message, or b"" (and ``peer`` closed) once the connection ends."""
    try:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        peer.close()
        return b""


def framed(message: bytes) -> bytes:
    return struct.pack(">i", len(message)) + message


def fetch_past_the_log_end_is_out_of_range(request: Any, response: Any) -> None:
    """Kafka's answer to a fetch from beyond the log end (Tansu's: no records, no error)."""
    asked = {(t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions}
    for topic in response.responses:
        for partition in topic.partitions:
            if asked[(topic.topic, partition.partition_index)] > partition.high_watermark:
                partition.error_code = OFFSET_OUT_OF_RANGE


def earliest_offset_unavailable(request: Any, response: Any) -> None:
    """The broker cannot tell any partition's earliest offset (a retriable error), only the latest."""
    asked = {(t.name, p.partition_index): p.timestamp for t in request.topics for p in t.partitions}
    for topic in response.topics:
        for partition in topic.partitions:
            if asked[(topic.name, partition.partition_index)] == EARLIEST:
                partition.error_code = LEADER_NOT_AVAILABLE


#: The topic a :func:`broker_behind_proxy` broker starts with.
PROXIED_TOPIC = "alma.tiny"


@pytest.fixture
def broker_behind_proxy(tmp_path) -> Iterator[Callable[[dict[Any, tuple[Any, Rewrite]]], RewritingProxy]]:
    """Factory: ``start(rewrites)`` -> a :class:`RewritingProxy` in front of a fresh Tansu holding
    :data:`PROXIED_TOPIC`; the broker advertises the proxy, so every connection goes through it."""
    started: list[tuple[KafkaBroker, RewritingProxy]] = []

    def start(rewrites: dict[Any, tuple[Any, Rewrite]]) -> RewritingProxy:
        port = free_port()
        broker = KafkaBroker(tmp_path / "tansu", advertised_port=port)
        broker.start()
        proxy = RewritingProxy(port, broker.port, rewrites)
        started.append((broker, proxy))
        broker.create_topic(PROXIED_TOPIC)
        return proxy

    yield start
    for broker, proxy in started:
        proxy.close()
        broker.stop()


class HeaderNameNotUtf8(str):
    """A header name that kafka-python's producer sends as bytes that are not UTF-8 (as a producer in
    another language may): kafka-python's consumer cannot parse the record holding it."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"\xff\xfe"


UNPARSEABLE = {"key": b"tiny/1", "value": b"x", "headers": [(HeaderNameNotUtf8("alma-schema"), b"1")]}


def send(bootstrap_servers: str, topic: str, partition: int, messages: list[dict[str, Any]]) -> None:
    """Send ``messages`` (producer.send keywords) to one partition, one record batch each."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    try:
        for message in messages:
            producer.send(topic, partition=partition, **message).get(timeout=30)
    finally:
        producer.close()


def as_messages(records: list[WireRecord]) -> list[dict[str, Any]]:
    return [{"key": r.key, "value": r.value, "headers": r.headers} for r in records]


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    assert value is not None, name
    return value


def dead_letters(redis_db) -> list[dict[str, str]]:
    entries = redis_db.xrange(StreamKeys(STREAM).dead)
    return [{k.decode(): v.decode(errors="replace") for k, v in fields.items()} for _, fields in entries]


@pytest.mark.integration
def test_a_record_kafka_python_cannot_parse_is_dead_lettered_and_its_partition_read_on(kafka_broker, redis_db) -> None:
    """The record sits in partition 1 while partition 0 holds records too, so the consumer must find
    which partition failed: moving partition 0 instead would skip one of its parts (and leave
    kafka-python spinning on partition 1)."""
    topic = "unparseable-in-partition-1"
    kafka_broker.create_topic(topic, partitions=2)
    parts = records_of(1)
    send(kafka_broker.bootstrap_servers, topic, 0, as_messages(parts[:20]))
    send(kafka_broker.bootstrap_servers, topic, 1, [UNPARSEABLE, *as_messages(parts[20:])])
    before = sample("alma_records_rejected_total", reason="headers")

    worker = kafka_worker(kafka_broker, topic, redis_db)
    drain(worker, redis_db, {"0": "20", "1": "21"})
    worker.stop()

    keys = StreamKeys(STREAM)
    assert redis_db.zrange(keys.ready, 0, -1) == [b"1"]
    (dead,) = dead_letters(redis_db)
    assert dead["reason"] == "headers" and dead["origin"] == f"{topic}/1@0"
    assert "UnicodeDecodeError" in dead["detail"]
    assert int(redis_db.hget(keys.ingest, "rejected:headers")) == 1
    assert sample("alma_records_rejected_total", reason="headers") == before + 1


@pytest.mark.integration
def test_the_records_batched_after_an_unparseable_one_are_dead_lettered_one_by_one(kafka_broker, redis_db) -> None:
    """kafka-python's parser stops at the bad record of a record batch, so the batch's later records
    cannot be read either: each is dead-lettered in turn and ingestion goes on after the batch."""
    topic = new_topic(kafka_broker)
    lost, kept = records_of(1)[:3], records_of(2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all", linger_ms=60_000)
    try:
        for message in [UNPARSEABLE, *as_messages(lost)]:
            producer.send(topic, **message)
        producer.flush(timeout=30)  # one record batch
    finally:
        producer.close()
    publish_kafka(kafka_broker, topic, kept)

    worker = kafka_worker(kafka_broker, topic, redis_db)
    drain(worker, redis_db, {"0": str(1 + len(lost) + len(kept))})
    worker.stop()

    assert redis_db.zrange(StreamKeys(STREAM).ready, 0, -1) == [b"2"]
    assert [d["origin"] for d in dead_letters(redis_db)] == [f"{topic}/0@{offset}" for offset in range(4)]


@pytest.mark.integration
def test_a_stored_offset_the_broker_no_longer_holds_is_read_from_the_earliest_record_with_a_warning(
    broker_behind_proxy, redis_db, caplog
) -> None:
    """kafka-python's default would move the consumer to the log end, skipping chunk 1 unread."""
    proxy = broker_behind_proxy({FetchRequest: (FetchResponse, fetch_past_the_log_end_is_out_of_range)})
    keys = StreamKeys(STREAM)
    redis_db.hset(keys.offsets, "0", "1000")  # e.g. the topic was deleted and made again
    parts = records_of(1)
    send(proxy.bootstrap_servers, PROXIED_TOPIC, 0, as_messages(parts))
    resets = sample("alma_kafka_offset_resets_total")

    worker = kafka_worker(proxy, PROXIED_TOPIC, redis_db)
    with caplog.at_level(logging.WARNING, logger="alma_daemon.transports.kafka"):
        drain(worker, redis_db, {"0": str(len(parts))}, limit_seconds=30)
    worker.stop()

    assert redis_db.zrange(keys.ready, 0, -1) == [b"1"]
    (warning,) = [r for r in caplog.records if r.name == "alma_daemon.transports.kafka"]
    assert warning.levelname == "WARNING" and warning.reason == "stored offset out of range"
    assert (warning.partition, warning.offset, warning.continue_at) == (0, 1000, "earliest")
    assert sample("alma_kafka_offset_resets_total") == resets + 1


@pytest.mark.integration
def test_the_lag_query_gives_up_on_an_offset_reset_the_broker_does_not_answer_and_reports_an_outage(
    broker_behind_proxy,
) -> None:
    """With no stored offset the consumer resets to the earliest one; while that cannot complete,
    the lag query (the ingest thread's health probe) must end with an outage, not wait on it."""
    proxy = broker_behind_proxy({ListOffsetsRequest: (ListOffsetsResponse, earliest_offset_unavailable)})
    source = KafkaSource(proxy.bootstrap_servers, PROXIED_TOPIC)
    try:
        source.seek({})
        deadline = time.monotonic() + 60  # a safety limit, not a timing check
        while not source.partitions:
            assert time.monotonic() < deadline, "the topic was never found"
            source.poll(0.2, 1)
        with pytest.raises(KafkaSource.unreachable, match="no position"):
            source.lag()
    finally:
        source.close()
