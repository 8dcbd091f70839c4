"""Outages are weather, not death: the daemon against a Redis and a Kafka broker that go away.

Each test runs ``alma run`` as a subprocess against real servers started here, takes a server away
at a point the daemon's own status names (mid-training, mid-stream), brings it back, and checks
what the daemon did meanwhile and that its series still equals ``alma simulate``'s. Limits bound
hangs; nothing here measures time.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.infra.outages import OutageBoard, OutageTooLong
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.research.simulate import run_simulation
from alma_daemon.runtime import run_beside_training
from alma_daemon.service.heartbeat import STATUS_FILE
from alma_daemon.transports.kafka import KafkaPublisher
from alma_daemon.transports.redis_stream import RedisStreamPublisher
from alma_daemon.transports.replay import dataset_chunks, replay
from tests.helpers.daemon import engine_state, exact, finish, service_config, start_daemon, wait_until, write_config
from tests.helpers.servers import KafkaBroker, RedisServer, free_port


class DurableRedis(RedisServer):
    """AOF fsynced on every write: a SIGKILL loses nothing committed, so the test's outcome does
    not depend on where in the AOF's one-second window the kill falls."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("everysec")] = "always"
        return command


def daemon_status(config) -> dict:
    path = Path(config.daemon.state_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return status | {"degraded": json.loads(status["degraded"])}


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def metric(port: int, name: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return next(line.split()[-1] for line in lines if line.startswith(name))


# -- pure logic -------------------------------------------------------------------------------------
def test_the_outage_board_keeps_the_first_failure_time_and_ends_past_the_limit() -> None:
    where = {"redis": "127.0.0.1:6379"}
    patient, impatient = OutageBoard(limit_seconds=3600), OutageBoard(limit_seconds=0.01, addresses=where)
    for board in (patient, impatient):
        first = board.down("redis", ConnectionError("refused"))
        later = board.down("redis", "still refused")
        assert later.since == first.since and later.reason == "still refused" and board.degraded
    time.sleep(0.05)
    patient.check_limit()
    with pytest.raises(
        OutageTooLong, match=r"^Redis at 127.0.0.1:6379 \(redis.url\) unreachable .* daemon.outage_limit_seconds"
    ):
        impatient.check_limit()
    assert patient.up("redis") is not None and not patient.degraded and patient.up("redis") is None


def test_a_thread_beside_training_runs_torch_on_one_thread_and_leaves_the_others_theirs() -> None:
    default = torch.get_num_threads()
    seen: dict[str, int] = {}

    def beside() -> None:
        run_beside_training()
        seen["beside"] = torch.get_num_threads()

    def started_later() -> None:
        seen["later"] = torch.get_num_threads()

    for target in (beside, started_later):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen == {"beside": 1, "later": default} and torch.get_num_threads() == default


# -- real servers -----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_redis_killed_mid_training_and_restarted_leaves_the_daemon_up_and_its_series_exact(tmp_path) -> None:
    redis = DurableRedis(tmp_path / "redis")
    redis.start()
    stream, metrics_port = "weather", free_port()
    data = service_config(
        tmp_path,
        redis.url,
        stream,
        stream={"megabatches": 4, "train_examples": 2400},
        # Long enough stages (about 300 steps each) that the 0.1 s poll below sees chunk 2 in progress:
        # at 4 epochs a stage took tens of milliseconds once the loop got faster, and the poll missed it.
        train={"epochs": 60, "patience": 60},
        metrics={"port": metrics_port},
    )
    config = build_config(data)
    client = redis.client()
    try:
        replay(dataset_chunks(config), RedisStreamPublisher(client, config.kafka.topic), stream, progress=False)
        daemon = start_daemon(write_config(tmp_path, data), "--until-chunks", "4")
        keys = StreamKeys(stream)
        wait_until(
            lambda: (client.hget(keys.daemon, "phase") or b"") == b"processing chunk 2", "training chunk 2", daemon
        )
        redis.kill()
        wait_until(lambda: daemon_status(config).get("degraded", {}).get("degraded"), "reporting degraded", daemon)
        wait_until(lambda: readyz(metrics_port) == 503, "/readyz not ready", daemon)
        assert metric(metrics_port, 'alma_server_up{server="redis"}') == "0.0"
        outage = daemon_status(config)["degraded"]["outages"][0]
        assert outage["server"] == "redis" and "Error" in outage["reason"]
        redis.start()
        finish(daemon)
        state = engine_state(client, stream)
    finally:
        client.close()
        redis.stop()
    assert state["chunks_seen"] == 4 and state["model_version"] == 4
    assert exact(state["series"]) == exact(run_simulation(config, progress=False)["series"])


@pytest.mark.integration
def test_a_redis_that_comes_back_empty_is_refused_and_so_is_a_start_on_it(tmp_path) -> None:
    redis = DurableRedis(tmp_path / "redis")
    redis.start()
    stream = "amnesia"
    data = service_config(
        tmp_path,
        redis.url,
        stream,
        stream={"megabatches": 4, "train_examples": 1200},
        train={"epochs": 4, "patience": 4},
    )
    config = build_config(data)
    config_path = write_config(tmp_path, data)
    client = redis.client()
    try:
        replay(dataset_chunks(config), RedisStreamPublisher(client, config.kafka.topic), stream, progress=False)
        daemon = start_daemon(config_path, "--until-chunks", "4")
        wait_until(lambda: engine_state(client, stream).get("chunks_seen", 0) >= 2, "two chunks processed", daemon)
        redis.kill()
        for name in ("appendonlydir", "dump.rdb"):  # a restart without its data
            path = redis.workdir / name
            if path.is_dir():
                for child in path.iterdir():
                    child.unlink()
        redis.start()
        output, _ = daemon.communicate(timeout=300)
        lines = output.decode().strip().splitlines()
        assert daemon.returncode == 1, output.decode()
        assert "came back without stream 'amnesia'" in lines[-1] and "RedisLostTheStream" in lines[-1]
        again = start_daemon(config_path, "--until-chunks", "4")
        output, _ = again.communicate(timeout=300)
        last = output.decode().strip().splitlines()[-1]
        assert again.returncode == 1 and "holds no stream 'amnesia'" in last and "RedisLostTheStream" in last
        # The model store records this Redis: it lost its data, and the store is no other Redis's.
        assert "records it on this same Redis" in last and "Redis has lost its data" in last
        assert "set daemon.checkpoint_dir to a new directory" in last
        assert client.get(StreamKeys(stream).engine) is None  # refused: nothing was started over
    finally:
        client.close()
        redis.stop()


@pytest.mark.integration
def test_an_outage_longer_than_the_limit_ends_the_daemon_with_one_line(tmp_path) -> None:
    redis = DurableRedis(tmp_path / "redis")
    redis.start()
    stream = "drought"
    data = service_config(tmp_path, redis.url, stream, daemon={"outage_limit_seconds": 2.0})
    config = build_config(data)
    client = redis.client()
    try:
        daemon = start_daemon(write_config(tmp_path, data))
        wait_until(lambda: client.hget(StreamKeys(stream).daemon, "phase") == b"waiting", "waiting", daemon)
        redis.kill()
        output, _ = daemon.communicate(timeout=300)
    finally:
        client.close()
        redis.stop()
    last = output.decode().strip().splitlines()[-1]
    assert daemon.returncode == 1, output.decode()
    assert last.startswith(f"alma run: error: Redis at 127.0.0.1:{redis.port} (redis.url) unreachable for "), last
    assert "longer than daemon.outage_limit_seconds (2 s): the daemon gives up" in last
    assert "Traceback" not in output.decode() and "terminate called" not in output.decode()
    assert daemon_status(config)["phase"] == "stopped"


@pytest.mark.integration
@pytest.mark.slow
def test_the_broker_stopped_and_restarted_while_chunks_flow_loses_no_chunk(tmp_path, redis_server, redis_db) -> None:
    broker = KafkaBroker(tmp_path / "tansu")
    broker.start()
    stream = "squall"
    data = service_config(
        tmp_path,
        redis_server.url,
        stream,
        stream={"megabatches": 4, "train_examples": 1200},
        kafka={"transport": "kafka", "bootstrap_servers": broker.bootstrap_servers},
    )
    config = build_config(data)
    broker.create_topic(config.kafka.topic)
    chunks = list(dataset_chunks(config))
    sent: list = []

    class Recording(KafkaPublisher):
        """Keeps what it sent: Tansu stores in memory, so after a restart the test puts the log back
        as a persistent Kafka would have kept it."""

        def send(self, records: list) -> None:
            sent.extend(records)
            super().send(records)

    try:
        daemon = start_daemon(write_config(tmp_path, data), "--until-chunks", "4")
        replay(iter(chunks[:2]), Recording(broker.bootstrap_servers, config.kafka.topic), stream, progress=False)
        keys = StreamKeys(stream)
        wait_until(lambda: int(redis_db.hget(keys.ingest, "chunks_received") or 0) == 2, "two chunks received", daemon)
        broker.stop()
        degraded = lambda: json.loads(redis_db.hget(keys.daemon, "degraded") or b"{}").get("outages", [])  # noqa: E731
        wait_until(lambda: [o["server"] for o in degraded()] == ["kafka"], "reporting the broker down", daemon)
        assert daemon.poll() is None
        broker.start()
        restored = KafkaPublisher(broker.bootstrap_servers, config.kafka.topic)
        restored.send(sent)
        replay(iter(chunks[2:]), restored, stream, progress=False)
        finish(daemon)
        assert degraded() == []
    finally:
        broker.stop()
    state = engine_state(redis_db, stream)
    assert state["chunks_seen"] == 4 and redis_db.xlen(keys.dead) == 0
    assert exact(state["series"]) == exact(run_simulation(config, progress=False)["series"])
