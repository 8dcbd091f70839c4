"""What the ``alma`` command tells a user besides its results: help texts, one-line errors, quiet logs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from kafka.errors import KafkaTimeoutError

from alma_daemon.cli import build_parser, main
from alma_daemon.config import build_config
from alma_daemon.infra.outages import OutageBoard, one_line
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.infra.unreachable import SERVER_KINDS, ServerUnreachable, reason_of, unreachable_line
from alma_daemon.local_servers import torchserve
from alma_daemon.local_servers.torchserve import TorchServeServer
from alma_daemon.logs import NOTICE, KeyValueFormatter, configure_logging, error_text, print_error
from alma_daemon.observability.progress import ProgressBar
from alma_daemon.service import embedded_redis
from alma_daemon.service.daemon_parts import EnginePart
from alma_daemon.service.heartbeat import Heartbeat
from alma_daemon.service.publish_handoff import PublishHandoff
from alma_daemon.service.status import phase_words
from alma_daemon.transports.kafka import KafkaPublisher
from serving.publishing.torchserve import TorchServeClient, TorchServeError
from tests.helpers.daemon import PROCESS_LIMIT_SECONDS, REPO
from tests.helpers.data import have
from tests.helpers.servers import free_port, free_ports


def _parsers(parser: argparse.ArgumentParser, name: str = "alma"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _parsers(subparser, f"{name} {sub}")


def test_every_command_opens_its_help_with_a_description_and_every_option_has_a_help_text():
    for name, parser in _parsers(build_parser()):
        assert parser.description, f"{name} --help has no description"
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):  # each subcommand is checked as a parser
                assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest} has no help text"


def test_grid_help_says_what_no_progress_does(capsys):
    with pytest.raises(SystemExit):
        main(["grid", "--help"])
    help_text = capsys.readouterr().out
    assert "run a grid of simulations into one folder" in help_text
    assert "hide the progress bars" in help_text


def test_an_error_line_names_the_class_once():
    assert error_text(KafkaTimeoutError("Unable to bootstrap")) == "KafkaTimeoutError: Unable to bootstrap"
    assert error_text(ValueError("--chunks must be >= 1")) == "ValueError: --chunks must be >= 1"
    assert error_text(KeyError("learner")) == "KeyError: learner"
    assert error_text(BrokenPipeError()) == "BrokenPipeError"
    # The outage board and the status file show the same text, on one line.
    assert one_line(KafkaTimeoutError("Unable to\n bootstrap")) == "KafkaTimeoutError: Unable to bootstrap"


def test_a_config_check_error_names_the_subcommand(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("learner: {name: sm, members: 3}\n")
    assert main(["config", "check", str(path)]) == 2
    assert capsys.readouterr().err.startswith("alma config check: config error: learner.members")


def test_status_with_no_daemon_state_says_so_in_one_line(tmp_path, capsys):
    assert main(["status", "--set", f"daemon.state_dir={tmp_path / 'none'}"]) == 1
    assert capsys.readouterr().err == (
        f"alma status: no daemon state under {tmp_path / 'none'}: no daemon has run with this config "
        "(set redis.url, or daemon.state_dir to the daemon's)\n"
    )


@pytest.mark.slow
def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """``alma config schema | head``: stdout's pipe is closed before alma writes to it."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "alma_daemon", "config", "schema"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 141


@pytest.fixture
def restore_logging():
    root, kafka = logging.getLogger(), logging.getLogger("kafka")
    handlers, root_level, kafka_level = root.handlers[:], root.level, kafka.level
    yield
    root.handlers[:] = handlers
    root.setLevel(root_level)
    kafka.setLevel(kafka_level)


def test_kafka_pythons_own_logs_are_quiet_by_default_and_shown_with_v(restore_logging):
    # kafka-python logs each failed connection attempt at ERROR, for as long as a broker is down.
    connection = logging.getLogger("kafka.conn")
    configure_logging(0)
    assert not connection.isEnabledFor(logging.ERROR)
    assert logging.getLogger("alma_daemon.service.ingest.worker").isEnabledFor(logging.WARNING)
    configure_logging(1)
    assert connection.isEnabledFor(logging.WARNING)


def test_a_warning_logged_under_the_progress_bar_gets_a_line_of_its_own(restore_logging, capsys):
    configure_logging(0)
    bar = ProgressBar(total=2)
    logging.getLogger("alma_daemon.test").warning("hello")
    bar.close()
    lines = re.split(r"[\r\n]", capsys.readouterr().err)
    assert any(re.fullmatch(r"\d\d:\d\d:\d\d warning alma_daemon.test: hello", line) for line in lines), lines
    assert logging.getLogger().handlers[0].stream is sys.stderr  # the console handler is back after the bar


def test_publishing_to_kafka_without_a_broker_fails_with_one_line_saying_what_to_do():
    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnreachable) as caught:
        KafkaPublisher(servers, "alma.test")
    assert str(caught.value) == (
        f"Kafka broker at {servers} (kafka.bootstrap_servers) cannot be reached: connection refused; start a "
        "broker there (`alma dev up` starts one), set kafka.bootstrap_servers to a running one, or use "
        "--embedded / kafka.transport: redis"
    )


def test_every_server_kind_names_its_config_key_and_a_fix():
    for kind, server in SERVER_KINDS.items():
        line = unreachable_line(kind, "127.0.0.1:1", ConnectionRefusedError(111, "Connection refused"))
        assert line.startswith(f"{server.name} at 127.0.0.1:1 ({server.key}) ") and "connection refused; " in line
        assert "\n" not in line and line.endswith(server.fix)


def test_the_reason_of_a_connection_failure_is_the_systems_few_words():
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    refused.__context__ = ConnectionRefusedError(111, "Connection refused")
    assert reason_of(refused) == "connection refused"
    assert reason_of(TimeoutError("timed out")) == "timed out"
    assert reason_of(KafkaTimeoutError("Unable to\n bootstrap")) == "KafkaTimeoutError: Unable to bootstrap"


def _run_settings(tmp_path) -> list[str]:
    values = {"daemon.state_dir": tmp_path / "state", "daemon.checkpoint_dir": tmp_path / "ms"}
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def test_a_wrong_redis_port_is_waited_for_then_one_line_naming_redis_url_and_the_fix(tmp_path, capsys, restore_logging):
    port = free_port()  # nobody listens
    url, limit = f"redis.url=redis://127.0.0.1:{port}/0", "daemon.outage_limit_seconds=1"
    assert main(["run", "--set", url, "--set", limit, *_run_settings(tmp_path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    where = f"Redis at 127.0.0.1:{port} (redis.url)"
    fix = (
        "start Redis there (`alma dev up` starts one), set redis.url to a running one, or use --embedded (no "
        "servers needed)"
    )
    assert len(lines) == 2, lines
    assert (
        f"{where} cannot be reached: connection refused; the daemon waits for it for up to 1 s "
        f"(daemon.outage_limit_seconds), then exits; {fix}"
    ) in lines[0]
    assert lines[1].startswith(f"alma run: error: {where} unreachable for "), lines
    assert "longer than daemon.outage_limit_seconds (1 s): the daemon gives up; last error: " in lines[1]
    assert lines[1].endswith(fix)


def test_status_against_a_wrong_redis_port_says_which_redis_and_what_to_do(tmp_path, capsys, restore_logging):
    port = free_port()
    assert main(["status", "--set", f"redis.url=redis://127.0.0.1:{port}/0", *_run_settings(tmp_path)]) == 1
    shown = capsys.readouterr().out
    assert re.search(rf"^redis +unreachable: Redis at 127.0.0.1:{port} \(redis.url\) cannot be reached: ", shown, re.M)


def _lines(stderr: str) -> list[str]:
    """What a terminal shows as lines: the bar redraws itself after a carriage return."""
    return [line for line in re.split(r"[\r\n]", stderr) if line.strip()]


def test_an_error_printed_while_the_progress_bar_is_up_gets_a_line_of_its_own(capsys):
    bar = ProgressBar(total=20)
    print_error("alma run: error: something failed")
    bar.close()
    lines = _lines(capsys.readouterr().err)
    assert "alma run: error: something failed" in lines, lines
    assert not any("chunk/s" in line and "error" in line for line in lines), lines


def test_an_error_at_start_up_comes_after_the_bar_is_closed_never_on_its_line(
    tmp_path, capsys, monkeypatch, restore_logging
):
    """The daemon's bar is up before the engine is restored; a failure there (a dataset missing, a
    model store of another stream) used to print on the bar's line."""

    class NoRedis:
        def get(self, key):
            return None

    def fail(self):
        raise RuntimeError("restore failed")

    monkeypatch.setattr(embedded_redis, "connect_redis", lambda config: NoRedis())
    monkeypatch.setattr(embedded_redis, "close_redis", lambda client: None)
    monkeypatch.setattr(EnginePart, "restore", fail)
    assert main(["run", "--until-chunks", "20", *_run_settings(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.endswith("\nalma run: error: RuntimeError: restore failed\n"), err
    assert "0/20" in _lines(err)[0]


@pytest.mark.integration
@pytest.mark.slow
# The daemon reads MNIST's test set before it connects to the broker. CI has ../shared/data, so the
# test runs there; a checkout without the data folder says why it skips instead of failing elsewhere.
@pytest.mark.skipif(not have("mnist"), reason="MNIST files not in the data folder (see README: data)")
def test_a_wrong_broker_address_is_one_warning_saying_how_long_the_daemon_waits_then_one_error(tmp_path):
    """Nothing listens at the broker's address; the embedded Redis is the buffer. The limit is small, so
    the daemon gives up within seconds."""
    servers = f"127.0.0.1:{free_port()}"
    settings = {
        "redis.url": "null",  # the embedded Redis (--embedded would also make Redis the transport)
        "kafka.transport": "kafka",
        "kafka.bootstrap_servers": servers,
        "daemon.outage_limit_seconds": 3,
        "stream.megabatches": 3,
        "dataset.test_examples": 100,
    }
    overrides = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    result = subprocess.run(
        [sys.executable, "-m", "alma_daemon", "run", "--until-chunks", "3", *overrides, *_run_settings(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert result.returncode == 1, result.stderr
    lines = _lines(result.stderr)
    warnings = [line for line in lines if " warning " in line]
    where = f"Kafka broker at {servers} (kafka.bootstrap_servers)"
    assert (
        len(warnings) == 1
        and (
            f"warning alma_daemon.service.ingest.worker: {where} cannot be reached: connection refused; the daemon "
            "waits for it for up to 3 s (daemon.outage_limit_seconds), then exits; start a broker there"
        )
        in warnings[0]
    ), lines
    assert lines[-1].startswith(f"alma run: error: {where} unreachable for "), lines
    assert "longer than daemon.outage_limit_seconds (3 s): the daemon gives up" in lines[-1]
    assert not any("{" in line for line in lines), lines  # no dict dumps
    assert not any("chunk/s" in line and ("warning" in line or "error" in line) for line in lines), lines
    assert any(line.startswith(f"waiting for {where.split(' (')[0]}: ") for line in lines), lines  # the bar says why


def _log_line(as_json: bool, **fields) -> str:
    record = logging.LogRecord("alma_daemon.test", logging.WARNING, __file__, 1, "health changed", (), None)
    record.__dict__.update(fields)
    return KeyValueFormatter(as_json).format(record)


def test_human_log_lines_show_scalars_and_json_lines_keep_the_structure():
    fields = {
        "healthy": False,
        "outages": [{"server": "kafka", "reason": "refused", "since": 1.5}, {"server": "redis"}],
        "limits": {"outage_seconds": 300, "servers": ["redis", "kafka"]},
        "nothing": [],
        "error": "first line\n  second line",
    }
    line = _log_line(False, **fields)
    assert line.endswith(
        "warning alma_daemon.test: health changed healthy=False outages=kafka,redis limits.outage_seconds=300 "
        "limits.servers=redis,kafka nothing=none error=first line second line"
    ), line
    assert "{" not in line and "[" not in line
    parsed = json.loads(_log_line(True, **fields))
    assert {key: parsed[key] for key in fields} == fields


def test_a_notice_shows_by_default_and_info_only_with_v(restore_logging):
    configure_logging(0)
    daemon = logging.getLogger("alma_daemon.service.daemon")
    assert daemon.isEnabledFor(NOTICE) and not daemon.isEnabledFor(logging.INFO)
    configure_logging(1)
    assert daemon.isEnabledFor(logging.INFO)


class SlowPublisher:
    """A background publisher whose last version goes live after ``busy`` waits."""

    def __init__(self, busy: int):
        self.busy = busy
        self.last_error = None

    def wait_idle(self, timeout: float) -> bool:
        self.busy -= 1
        return self.busy < 0

    def not_live(self):
        return None if self.busy < 0 else (12, 11)


def test_a_run_that_reached_its_last_chunk_tells_it_waits_for_the_last_swap(caplog):
    handoff = PublishHandoff(None)
    handoff.publisher = SlowPublisher(busy=3)
    waits: list[str] = []
    with caplog.at_level(NOTICE, logger="alma_daemon.service.publish_handoff"):
        handoff.drain(on_wait=waits.append)
    assert waits and set(waits) == {"the swap of version 12"}
    notices = [r.getMessage() for r in caplog.records if r.levelno == NOTICE]
    assert notices and all(
        re.fullmatch(
            r"the run is done; waiting for the swap of version 12 before exiting: \d+ s so far, up to 120 s", n
        )
        for n in notices
    ), notices
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_swap_done_at_once_is_not_told(caplog):
    handoff = PublishHandoff(None)
    handoff.publisher = SlowPublisher(busy=0)
    waits: list[str] = []
    with caplog.at_level(NOTICE, logger="alma_daemon.service.publish_handoff"):
        handoff.drain(on_wait=waits.append)
    assert waits == [] and not caplog.records


def _daemon_fields(**fields) -> dict:
    return {"running": True, "pid": 7, "phase": "waiting", "waiting_for": None, "phase_seconds": 0.5, **fields}


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"waiting_for": "the swap of version 12", "phase_seconds": 40.2}, "waiting for the swap of version 12, 40 s"),
        ({"waiting_for": "missing chunk 7", "phase_seconds": 1.0}, "waiting for missing chunk 7"),
        (
            {"waiting_for": "Kafka broker at 127.0.0.1:9092", "phase_seconds": 75},
            "waiting for Kafka broker at 127.0.0.1:9092, 75 s",
        ),
        ({"phase": "processing chunk 5", "phase_seconds": 12}, "processing chunk 5, 12 s"),
        ({"phase": "stopped", "phase_seconds": 600}, "stopped"),
        ({}, "waiting"),
    ],
)
def test_status_names_what_the_daemon_waits_for_and_how_long(fields, shown):
    assert phase_words(_daemon_fields(**fields)) == shown


class Hash(dict):
    def hset(self, key, mapping):
        self.update(mapping)


def test_a_wait_a_policy_check_interrupts_keeps_its_start():
    hash_ = Hash()
    heartbeat = Heartbeat(hash_, StreamKeys("s"), Path("unused"), OutageBoard(1.0))
    heartbeat.set_phase("waiting", "Kafka broker at 127.0.0.1:9092")
    since = hash_["phase_since"]
    time.sleep(0.01)
    heartbeat.set_phase("policy check")
    heartbeat.set_phase("waiting", "Kafka broker at 127.0.0.1:9092")
    assert hash_["phase_since"] == since and hash_["waiting_for"] == "Kafka broker at 127.0.0.1:9092"
    heartbeat.set_phase("processing chunk 2")
    heartbeat.set_phase("waiting", "Kafka broker at 127.0.0.1:9092")
    assert hash_["phase_since"] != since, "a chunk processed in between: another wait"


def test_an_unreachable_torchserve_is_one_line_naming_the_url_key_it_was_looked_for_at():
    management, inference = (f"http://127.0.0.1:{port}" for port in free_ports(2))
    client = TorchServeClient(management, inference)
    with pytest.raises(TorchServeError) as caught:
        client.versions("mnist")
    assert caught.value.status is None
    assert str(caught.value).startswith(
        f"TorchServe at {management} (serving.management_url) cannot be reached: connection refused; start it "
        "with `alma serve`"
    )
    with pytest.raises(TorchServeError, match=rf"^TorchServe at {inference} \(serving.inference_url\) "):
        client.predict("mnist", 1, {})


def test_alma_serve_tells_each_stage_of_a_slow_start(tmp_path, monkeypatch):
    """On a busy host TorchServe's JVM may take a minute to answer /ping: the wait is told as it goes."""
    monkeypatch.setattr(torchserve, "PING_REPORT_SECONDS", 0.1)
    monkeypatch.setattr(torchserve, "require_torchserve", lambda: None)
    told: list[str] = []
    process = TorchServeServer.for_config(build_config({"daemon": {"state_dir": str(tmp_path)}}), report=told.append)
    # A process that listens nowhere stands in for TorchServe, which answers /ping at the sixth try.
    monkeypatch.setattr(process, "command", lambda: ["sleep", "60"])
    process.ports = []
    answers = iter([False] * 5 + [True])  # 0.1 s between two pings
    monkeypatch.setattr(process, "answers_ping", lambda: next(answers))
    process.start()
    process.stop()
    ping = "http://127.0.0.1:8080/ping"
    assert (
        told[0] == "starting TorchServe (normal priority, niceness 19 once a version is loaded; "
        f"its log: {tmp_path.resolve() / 'torchserve' / 'torchserve.log'})"
    )
    assert told[1].startswith(f"waiting for TorchServe to answer {ping}: ") and told[1].endswith(
        " s so far, up to 600 s"
    )
    assert re.fullmatch(rf"TorchServe answers {ping} after \d+ s", told[-1]), told
