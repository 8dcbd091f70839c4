"""Outages at any moment of start-up: Redis or the broker lost before the daemon's loop runs is an
outage like any other (docs/service.md, "Outages"): waited for up to ``daemon.outage_limit_seconds``,
reported in one line and in ``alma status``, then either the daemon goes on or it exits 1 with the
running daemon's last line.

The servers are taken away at points the daemon's own state names (a start-up step called, the
status file saying what it waits for), never after a delay; limits bound hangs, nothing here
measures time.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from alma_daemon.config import build_config
from alma_daemon.infra.connections import redis_client
from alma_daemon.infra.outages import OutageBoard, OutageTooLong, wait_out
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service import daemon_parts
from alma_daemon.service.daemon import Daemon
from alma_daemon.service.heartbeat import STATUS_FILE, Heartbeat
from alma_daemon.service.ingest.store import IngestStore
from alma_daemon.service.stream_identity import StreamIdentity
from alma_daemon.transports.kafka import KafkaPublisher
from alma_daemon.transports.redis_stream import RedisStreamPublisher
from alma_daemon.transports.replay import dataset_chunks, replay
from tests.helpers.daemon import (
    PROCESS_LIMIT_SECONDS,
    REPO,
    engine_state,
    finish,
    service_config,
    start_daemon,
    wait_until,
    write_config,
)
from tests.helpers.servers import KafkaBroker, RedisServer


def refused() -> redis.ConnectionError:
    """What redis-py raises when nothing listens, with the operating system's reason behind it."""
    error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    error.__context__ = ConnectionRefusedError(111, "Connection refused")
    return error


class DurableRedis(RedisServer):
    """AOF fsynced on every write: a SIGKILL loses nothing, whatever the moment."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("everysec")] = "always"
        return command


def status_file(config) -> dict:
    path = Path(config.daemon.state_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def alma_status(config_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "alma_daemon", "status", "--config", str(config_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )


def failing(times: int, error: Callable[[], BaseException] = refused) -> Callable[[], str]:
    calls = {"n": 0}

    def work() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error()
        return f"answered at call {calls['n']}"

    return work


# -- the retry (no servers) -------------------------------------------------------------------------
def test_a_step_that_meets_an_outage_is_redone_once_the_server_answers_with_one_warning(caplog) -> None:
    board, seen = OutageBoard(3600, {"redis": "127.0.0.1:1"}), []
    with caplog.at_level(logging.WARNING, logger="alma_daemon.infra.outages"):
        answer = wait_out(failing(3), board, "redis", on_wait=seen.append, sleep=lambda seconds: None)
    assert answer == "answered at call 4" and not board.degraded
    assert seen[-1] is None and seen[:-1] and all(o is not None and o.server == "redis" for o in seen[:-1])
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("Redis at 127.0.0.1:1 (redis.url) cannot be reached: connection refused; the daemon")
    assert "waits for it for up to 3600 s (daemon.outage_limit_seconds), then exits" in warning


def test_a_step_that_answers_at_once_reports_no_outage() -> None:
    board, seen = OutageBoard(3600), []
    assert wait_out(failing(0), board, "redis", on_wait=seen.append) == "answered at call 1"
    assert seen == [] and not board.degraded


def test_an_outage_past_the_limit_ends_the_wait_with_the_running_daemons_line() -> None:
    board = OutageBoard(0.01, {"redis": "127.0.0.1:1"})
    with pytest.raises(OutageTooLong) as ended:
        wait_out(failing(10**6), board, "redis", tick_seconds=0.005)
    line = str(ended.value)
    assert line.startswith("Redis at 127.0.0.1:1 (redis.url) unreachable for ") and "\n" not in line
    assert "longer than daemon.outage_limit_seconds (0.01 s): the daemon gives up; last error: " in line


def test_an_error_that_is_no_outage_is_not_retried() -> None:
    board = OutageBoard(3600)
    with pytest.raises(ValueError):
        wait_out(failing(1, lambda: ValueError("a defect")), board, "redis", sleep=lambda seconds: None)
    assert not board.degraded


# -- Redis lost during the daemon's start (in process) ----------------------------------------------
#: Start-up steps that talk to Redis, and where to cut it: before the step's first command.
STEPS: dict[str, tuple[object, str]] = {
    "identity": (StreamIdentity, "establish"),
    "restore": (daemon_parts, "restore_engine"),
    "heartbeat": (Heartbeat, "started"),
    "ingest": (IngestStore, "follow_server"),
}


def cut_redis_before(monkeypatch, step: str, server: RedisServer, board: Callable[[], OutageBoard], back: bool):
    """Kill Redis when ``step`` is first called; with ``back``, start it again once the daemon reports it down."""
    owner, name = STEPS[step]
    original = getattr(owner, name)
    state: dict[str, threading.Thread | None] = {"restarter": None}

    def restart_once_reported() -> None:
        wait_until(lambda: board().is_down("redis"), "Redis reported down")
        server.start()

    def cut(*args, **kwargs):
        if state["restarter"] is None:
            server.kill()
            state["restarter"] = threading.Thread(target=restart_once_reported, daemon=True)
            if back:
                state["restarter"].start()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, cut)
    return state


@pytest.mark.integration
@pytest.mark.parametrize("step", list(STEPS))
def test_redis_lost_at_a_start_up_step_and_back_within_the_limit_lets_the_daemon_go_on(
    tmp_path, monkeypatch, step
) -> None:
    server = DurableRedis(tmp_path / "redis")
    server.start()
    stream = f"start-{step}"
    config = build_config(service_config(tmp_path, server.url, stream))
    client = redis_client(config.redis)
    try:
        replay(dataset_chunks(config), RedisStreamPublisher(client, config.kafka.topic), stream, progress=False)
        daemon = Daemon(config, client, until_chunks=4)
        state = cut_redis_before(monkeypatch, step, server, lambda: daemon.outages, back=True)
        daemon.run()
        assert state["restarter"] is not None
        state["restarter"].join(PROCESS_LIMIT_SECONDS)
        result = engine_state(client, stream)
    finally:
        client.close()
        server.stop()
    assert result["chunks_seen"] == 4 and result["model_version"] == 4
    assert not daemon.outages.degraded


@pytest.mark.integration
def test_redis_lost_during_the_restore_for_longer_than_the_limit_ends_the_start_with_one_line(
    tmp_path, monkeypatch
) -> None:
    server = DurableRedis(tmp_path / "redis")
    server.start()
    stream = "start-drought"
    config = build_config(service_config(tmp_path, server.url, stream, daemon={"outage_limit_seconds": 1.0}))
    client = redis_client(config.redis)
    try:
        daemon = Daemon(config, client, until_chunks=4)
        cut_redis_before(monkeypatch, "restore", server, lambda: daemon.outages, back=False)
        with pytest.raises(OutageTooLong) as ended:
            daemon.run()
    finally:
        client.close()
        server.stop()
    assert str(ended.value).startswith(f"Redis at 127.0.0.1:{server.port} (redis.url) unreachable for ")
    assert "longer than daemon.outage_limit_seconds (1 s): the daemon gives up" in str(ended.value)
    assert status_file(config)["phase"] == "stopped"


# -- alma run against a Redis that is down when it starts --------------------------------------------
@pytest.mark.integration
def test_alma_run_waits_for_a_redis_down_at_its_start_shows_the_wait_in_status_and_goes_on(tmp_path) -> None:
    server = DurableRedis(tmp_path / "redis")
    server.start()
    stream = "late-redis"
    data = service_config(tmp_path, server.url, stream)
    config = build_config(data)
    config_path = write_config(tmp_path, data)
    client = server.client()
    try:
        replay(dataset_chunks(config), RedisStreamPublisher(client, config.kafka.topic), stream, progress=False)
        server.stop()
        daemon = start_daemon(config_path, "--until-chunks", "4")
        where = f"Redis at 127.0.0.1:{server.port}"
        wait_until(lambda: status_file(config).get("waiting_for") == where, "waiting for Redis", daemon)
        assert status_file(config)["phase"] == "waiting"
        shown = alma_status(config_path)
        assert shown.returncode == 1 and f"waiting for {where}" in shown.stdout, shown.stdout + shown.stderr
        assert json.loads(status_file(config)["degraded"])["outages"][0]["server"] == "redis"
        server.start()
        output = finish(daemon)
        state = engine_state(client, stream)
    finally:
        client.close()
        server.stop()
    assert state["chunks_seen"] == 4
    warnings = [line for line in output.splitlines() if " warning " in line]
    assert len(warnings) == 1 and f"{where} (redis.url) cannot be reached: connection refused" in warnings[0]
    assert "Traceback" not in output


@pytest.mark.integration
def test_alma_run_against_a_redis_down_longer_than_the_limit_exits_1_with_one_line(tmp_path) -> None:
    server = DurableRedis(tmp_path / "redis")
    server.start()
    server.stop()  # it was there once: its port is known, and nothing listens on it now
    stream = "no-redis"
    data = service_config(tmp_path, server.url, stream, daemon={"outage_limit_seconds": 2.0})
    config = build_config(data)
    daemon = start_daemon(write_config(tmp_path, data), "--until-chunks", "4")
    output, _ = daemon.communicate(timeout=PROCESS_LIMIT_SECONDS)
    text = output.decode()
    last = text.strip().splitlines()[-1]
    assert daemon.returncode == 1, text
    assert last.startswith(f"alma run: error: Redis at 127.0.0.1:{server.port} (redis.url) unreachable for "), last
    assert "longer than daemon.outage_limit_seconds (2 s): the daemon gives up" in last
    assert "Traceback" not in text
    assert status_file(config)["phase"] == "stopped"


# -- the broker ------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_alma_run_waits_for_a_broker_down_at_its_start_and_goes_on_once_it_is_back(
    tmp_path, redis_server, redis_db
) -> None:
    broker = KafkaBroker(tmp_path / "tansu")
    broker.start()
    stream = "late-broker"
    data = service_config(
        tmp_path,
        redis_server.url,
        stream,
        kafka={"transport": "kafka", "bootstrap_servers": broker.bootstrap_servers},
    )
    config = build_config(data)
    broker.create_topic(config.kafka.topic)
    broker.stop()  # Tansu keeps its topics in memory: start() makes them again, empty
    try:
        daemon = start_daemon(write_config(tmp_path, data), "--until-chunks", "4")
        keys = StreamKeys(stream)
        degraded = lambda: json.loads(redis_db.hget(keys.daemon, "degraded") or b"{}").get("outages", [])  # noqa: E731
        wait_until(lambda: [o["server"] for o in degraded()] == ["kafka"], "reporting the broker down", daemon)
        broker.start()
        replay(
            dataset_chunks(config), KafkaPublisher(broker.bootstrap_servers, config.kafka.topic), stream, progress=False
        )
        output = finish(daemon)
    finally:
        broker.stop()
    assert engine_state(redis_db, stream)["chunks_seen"] == 4 and degraded() == []
    assert "Traceback" not in output
