"""The component graph the daemon and `alma run` start and stop their parts with (service/components.py)."""

from __future__ import annotations

import logging

import pytest

from alma_daemon.config import build_config
from alma_daemon.service.components import Component, ComponentGraph, NotStarted, start_order, started
from alma_daemon.service.daemon import Daemon


class Part(Component):
    """A part that writes its starts and stops into ``log``, and fails where told."""

    def __init__(self, name: str, log: list[str], requires: tuple[str, ...] = (), fail: str = ""):
        self.name = name  # a class constant on real parts
        self.requires = requires
        self.log = log
        self.fail = fail

    def start(self) -> None:
        if self.fail == "start":
            raise RuntimeError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")
        self.log.append(f"stop {self.name}")


def test_parts_start_after_what_they_require_and_stop_in_reverse() -> None:
    log: list[str] = []
    # Listed out of order: the graph starts each part after the parts it requires.
    graph = ComponentGraph(
        [
            Part("scheduler", log, requires=("ingest", "engine")),
            Part("ingest", log, requires=("engine",)),
            Part("metrics", log),
            Part("engine", log),
        ]
    )
    with graph:
        assert log == ["start metrics", "start engine", "start ingest", "start scheduler"]
    assert log[4:] == ["stop scheduler", "stop ingest", "stop engine", "stop metrics"]


def test_a_list_that_respects_requires_starts_in_its_own_order() -> None:
    log: list[str] = []
    names = ["followers", "engine", "heartbeat", "publisher", "metrics"]
    parts = [Part(name, log, requires=("engine",) if name in ("heartbeat", "publisher") else ()) for name in names]
    assert [part.name for part in start_order(parts)] == names


def test_a_start_that_fails_stops_the_started_parts_and_raises() -> None:
    log: list[str] = []
    graph = ComponentGraph(
        [Part("redis", log), Part("engine", log), Part("metrics", log, fail="start"), Part("x", log)]
    )
    with pytest.raises(RuntimeError, match="metrics cannot start"):
        graph.start()
    # The part that failed left nothing open; the one after it never started.
    assert log == ["start redis", "start engine", "stop engine", "stop redis"]
    graph.stop()
    assert len(log) == 4, "a graph stops nothing twice"


def test_a_stop_that_fails_is_logged_and_the_others_still_stop(caplog) -> None:
    log: list[str] = []
    graph = ComponentGraph([Part("redis", log), Part("ingest", log, fail="stop"), Part("scheduler", log)])
    graph.start()
    with caplog.at_level(logging.WARNING, logger="alma_daemon.service.components"):
        graph.stop()
    assert log[3:] == ["stop scheduler", "stop redis"]
    (record,) = caplog.records
    assert record.getMessage() == "shutdown step failed"
    assert (record.step, record.error) == ("ingest", "RuntimeError: ingest cannot stop")


def test_an_interrupt_during_the_start_stops_the_started_parts_too() -> None:
    log: list[str] = []

    class Interrupted(Part):
        def start(self) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ComponentGraph([Part("signals", log), Interrupted("engine", log)]).start()
    assert log == ["start signals", "stop signals"]


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([("a", ()), ("a", ())], "two components are named 'a'"),
        ([("a", ("b",))], "component 'a' requires 'b', which is not in the graph"),
        ([("a", ("b",)), ("b", ("a",)), ("c", ())], "components a, b cannot start: their requires form a cycle"),
    ],
)
def test_a_graph_that_cannot_be_ordered_is_refused_naming_the_parts(parts, message) -> None:
    with pytest.raises(ValueError, match=message):
        ComponentGraph([Part(name, [], requires=requires) for name, requires in parts])


def test_a_resource_asked_for_before_its_part_started_names_the_part() -> None:
    assert started(3, "ingest") == 3
    with pytest.raises(NotStarted, match="the ingest part has not started"):
        started(None, "ingest")


def test_the_daemon_starts_its_engine_first_and_stops_its_port_first_and_its_followers_last(tmp_path) -> None:
    """What the daemon's order is for: nothing touches the stream before the engine checked its
    identity; /metrics closes as soon as the daemon stops, before the threads are joined; the other
    ranks are told to leave once nothing runs."""
    config = build_config({"daemon": {"state_dir": str(tmp_path / "state"), "checkpoint_dir": str(tmp_path / "ms")}})
    starts = [part.name for part in Daemon(config, client=None, replay=True).parts.order]
    assert starts[:3] == ["followers", "engine", "replay"]
    stops = starts[::-1]
    assert stops[:2] == ["health", "metrics"] and stops[-1] == "followers"
    assert {"scheduler", "ingest", "publisher", "heartbeat", "signals"} <= set(stops[2:-2])
