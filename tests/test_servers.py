"""Each fixture of tests/helpers/servers.py starts a real server that real clients can use and stop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import (
    KafkaBroker,
    RedisServer,
    ServerStartError,
    free_port,
    free_ports,
    group_members,
    http_request,
    metrics_page,
    port_open,
)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


# --------------------------------------------------------------------------------------- Redis


@pytest.mark.integration
def test_redis_db_is_empty_and_usable(redis_server: RedisServer, redis_db) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert redis_db.dbsize() == 0
    redis_db.set("k", b"v")
    assert redis_db.get("k") == b"v"


@pytest.mark.integration
def test_redis_restart_keeps_data_and_kill_brings_it_down(redis_server: RedisServer, redis_db) -> None:
    redis_db.set("survives", b"1")
    redis_server.stop()
    assert not port_open(redis_server.port)
    redis_server.start()
    with redis_server.client() as client:
        assert client.get("survives") == b"1"

    pid = redis_server.pid
    redis_server.kill()
    assert not port_open(redis_server.port)
    assert not group_members(pid)
    redis_server.start()
    with redis_server.client() as client:
        assert client.ping()


@pytest.mark.integration
def test_failed_start_reports_the_log_tail(tmp_path: Path) -> None:
    class BadRedis(RedisServer):
        def command(self) -> list[str]:
            return [*super().command(), "--no-such-directive", "x"]

    server = BadRedis(tmp_path)
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 1.*no-such-directive"):
        server.start()
    assert not server.running


@pytest.mark.integration
@pytest.mark.usefixtures("redis_db")
def test_start_refuses_a_port_in_use(redis_server: RedisServer, tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="already listens"):
        RedisServer(tmp_path, port=redis_server.port).start()


@pytest.mark.integration
def test_a_server_whose_chosen_port_is_taken_before_its_start_moves_to_a_free_one(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    first = server.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        server.start()
        try:
            assert server.port != first and server.ports == [server.port]
            with server.client() as client:
                assert client.ping()
        finally:
            server.stop()


@pytest.mark.integration
def test_a_server_that_cannot_bind_its_chosen_port_starts_again_on_fresh_ones(tmp_path: Path) -> None:
    """The race itself: nothing listens on the chosen port, but another socket holds it by the time
    the server binds. Tansu then exits (with code 0); the start goes on with a fresh port."""
    broker = KafkaBroker(tmp_path)
    first = broker.port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))  # bound, not listening: port_open() sees nothing
        broker.start()
        try:
            assert broker.port != first and broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
            broker.create_topic("moved")
        finally:
            broker.stop()
    assert "taken by another process" in broker.log_tail(400)


# --------------------------------------------------------------------------------------- Kafka


def _consume(broker: KafkaBroker, topic: str, count: int) -> list:
    from kafka import KafkaConsumer, TopicPartition

    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    try:
        consumer.assign([partition])
        consumer.seek(partition, 0)
        records: list = []
        deadline = time.monotonic() + 10
        while len(records) < count and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=500).get(partition, [])
        end = consumer.end_offsets([partition])[partition]
    finally:
        consumer.close()
    assert end == count
    return records


@pytest.mark.integration
def test_kafka_produce_with_headers_then_assign_and_seek(kafka_broker: KafkaBroker) -> None:
    from kafka import KafkaProducer

    kafka_broker.create_topic("servers-headers")
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, allow_auto_create_topics=False)
    try:
        # One get() per send: each record is its own batch, the case where Tansu's
        # end_offsets() is right.
        for part in range(3):
            producer.send(
                "servers-headers",
                key=b"s/7",
                value=bytes([part]) * 10,
                headers=[("alma-chunk", b"7"), ("alma-part", str(part).encode())],
            ).get(timeout=10)
    finally:
        producer.close()

    records = _consume(kafka_broker, "servers-headers", 3)
    assert [r.offset for r in records] == [0, 1, 2]
    assert [r.key for r in records] == [b"s/7"] * 3
    assert [dict(r.headers)["alma-part"] for r in records] == [b"0", b"1", b"2"]


@pytest.mark.integration
def test_kafka_restart_on_same_port_recreates_topics(kafka_broker: KafkaBroker) -> None:
    from kafka import KafkaProducer

    kafka_broker.create_topic("servers-restart", partitions=2)
    address = kafka_broker.bootstrap_servers
    kafka_broker.stop()
    assert not port_open(kafka_broker.port)
    kafka_broker.start()
    assert kafka_broker.bootstrap_servers == address

    # A producer made before the restart would fail with UnknownProducerIdError (idempotence
    # is on by default): a fresh one is needed.
    producer = KafkaProducer(bootstrap_servers=address, allow_auto_create_topics=False)
    try:
        assert producer.partitions_for("servers-restart") == {0, 1}
        producer.send("servers-restart", value=b"after", partition=0).get(timeout=10)
    finally:
        producer.close()
    assert [r.value for r in _consume(kafka_broker, "servers-restart", 1)] == [b"after"]


# ---------------------------------------------------------------------------------- Prometheus


@pytest.fixture
def metrics_endpoint() -> Iterator[str]:
    """A minimal /metrics page in Prometheus text format, served from a thread."""

    with metrics_page(b"# TYPE alma_probe gauge\nalma_probe 42\n") as address:
        yield address


@pytest.mark.integration
def test_prometheus_scrapes_a_target(prometheus_server, metrics_endpoint: str) -> None:
    prom = prometheus_server([metrics_endpoint])
    result = prom.wait_for("alma_probe")
    assert result and result[0]["value"][1] == "42"
    assert result[0]["metric"]["instance"] == metrics_endpoint
    assert prom.query("up")[0]["value"][1] == "1"

    prom.stop()
    assert not port_open(prom.port)


# ---------------------------------------------------------------------------------- TorchServe

HANDLER = '''
def handle(data, context):
    """Answers each request with the length of its body; enough to prove serving works."""
    if data is None:
        return None
    return [len(row.get("body") or row.get("data") or b"") for row in data]
'''


def _build_mar(tmp_path: Path, model_store: Path) -> str:
    handler = tmp_path / "length_handler.py"
    handler.write_text(HANDLER)
    subprocess.run(
        [
            sys.executable, "-m", "model_archiver.model_packaging",
            "--model-name", "tiny",
            "--version", "1",
            "--handler", str(handler),
            "--export-path", str(model_store),
            "--force",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return "tiny.mar"


@pytest.mark.integration
def test_torchserve_serves_a_tiny_model_and_stops_for_good(torchserve_server, tmp_path: Path) -> None:
    ts = torchserve_server()
    mar = _build_mar(tmp_path, ts.model_store)

    status, body = http_request(
        "POST",
        f"{ts.management_url}/models?url={mar}&model_name=tiny&synchronous=true&initial_workers=1",
    )
    assert status == 200, body
    # urllib's default form content type would make TorchServe parse the body as form fields.
    status, body = http_request(
        "POST",
        f"{ts.inference_url}/predictions/tiny",
        b"12345",
        {"Content-Type": "application/octet-stream"},
    )
    assert (status, body.strip()) == (200, b"5")
    status, body = http_request("GET", f"{ts.metrics_url}/metrics")
    assert status == 200 and b"ts_inference_requests_total" in body
    status, body = http_request("DELETE", f"{ts.management_url}/models/tiny")
    assert status == 200, body

    pid = ts.pid
    ts.stop()
    assert not group_members(pid), "JVM or model workers outlived stop()"
    assert not any(port_open(port) for port in ts.ports)

    ts.start()
    status, body = http_request("GET", f"{ts.management_url}/models")
    assert status == 200 and json.loads(body)["models"] == []
