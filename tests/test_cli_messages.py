"""What the ``alma`` command tells a user besides its results: help texts, one-line errors, quiet logs."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from alma_daemon.cli import build_parser, main
from alma_daemon.infra.outages import one_line
from alma_daemon.logs import configure_logging, error_text
from alma_daemon.observability.progress import ProgressBar
from alma_daemon.transports.kafka import KafkaPublisher
from tests.helpers.servers import free_port


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
    with pytest.raises(KafkaConnectionError) as caught:
        KafkaPublisher(servers, "alma.test")
    assert str(caught.value) == (
        f"KafkaConnectionError: no Kafka broker answered at {servers} (kafka.bootstrap_servers); start one, "
        f"or use --embedded / kafka.transport: redis"
    )
