"""The daemon's parts, each a component (service/components.py) that the daemon starts in dependency
order and stops in reverse; docs/architecture.md draws the graph.

A part is given the daemon, as a Celery bootstep is given its worker: it opens one thing the main
loop or another part uses, and closes it. Adding a part is a class here and a line in
:func:`daemon_parts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apscheduler.schedulers.background import BackgroundScheduler

from alma_daemon.observability.exporter import start_exporter
from alma_daemon.service.bootstrap import event_stream
from alma_daemon.service.components import Component, started
from alma_daemon.service.ingest.worker import IngestWorker
from alma_daemon.service.redis_outage import start_step
from alma_daemon.service.scheduler import build_scheduler
from alma_daemon.transports import build_source

if TYPE_CHECKING:
    from alma_daemon.service.daemon import Daemon


class DaemonPart(Component):
    """A part of :class:`~alma_daemon.service.daemon.Daemon`."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon


class FollowersPart(DaemonPart):
    """Under torchrun, the other ranks (service/rank_followers.py): they are handed the engine each
    time it is restored, and told to leave at the end."""

    name = "followers"

    def stop(self) -> None:
        self.daemon.followers.stop()


class EnginePart(DaemonPart):
    """The engine as the last committed step left it, once the stream's identity is checked."""

    name = "engine"
    # A restore hands the followers the engine.
    requires = ("followers",)

    def start(self) -> None:
        if not self.daemon.restored:  # a caller may restore before the run, to read the state first
            start_step(self.daemon, self.daemon.restore)


class ReplayPart(DaemonPart):
    """``alma run --replay``: the dataset published into the stream from a thread of this process."""

    name = "replay"
    # Nothing is written into a stream before its identity is checked (a Redis that lost it is refused).
    requires = ("engine",)

    def start(self) -> None:
        started(self.daemon.replayer, self.name).start()

    def stop(self) -> None:
        self.daemon.request_stop()  # the thread ends once the daemon stops
        started(self.daemon.replayer, self.name).stop()


class HeartbeatPart(DaemonPart):
    """The daemon's pid and phase in ``alma:{s}:daemon`` and the status file, for ``alma status``."""

    name = "heartbeat"
    requires = ("engine",)

    def start(self) -> None:
        policy = self.daemon.config.policy
        bound = {"chunks": policy.max_model_age_chunks, "seconds": policy.max_model_age_seconds}
        start_step(self.daemon, lambda: self.daemon.heartbeat.started(bound))

    def stop(self) -> None:
        try:
            self.daemon.set_phase("stopped")
        finally:
            self.daemon.write_status()


class SignalsPart(DaemonPart):
    """SIGTERM and Ctrl-C finish the step, then stop (service/signals.py)."""

    name = "signals"
    # A signal during the restore ends it at once: the handlers cover the main loop's steps.
    requires = ("engine",)

    def start(self) -> None:
        self.daemon.signals.install()

    def stop(self) -> None:
        self.daemon.signals.restore()


class PublisherPart(DaemonPart):
    """The publisher's thread, which versions go to once their step is committed."""

    name = "publisher"
    # The restore withdraws the checkpoint of an uncommitted step before the publisher can see it.
    requires = ("engine",)

    def start(self) -> None:
        self.daemon.handoff.start()

    def stop(self) -> None:
        self.daemon.handoff.close()


class IngestPart(DaemonPart):
    """The ingest thread: records from the transport into Redis, exactly once."""

    name = "ingest"
    # It accepts what the stream's task takes (the schema), known once the engine is restored.
    requires = ("engine",)

    def start(self) -> None:
        daemon, config = self.daemon, self.daemon.config
        source = build_source(config, daemon.client)
        worker = start_step(
            daemon,
            lambda: IngestWorker(
                source,
                daemon.client,
                daemon.keys,
                started(daemon.schema, "engine"),
                max_buffer_bytes=config.redis.max_buffer_bytes,
                max_chunks_ahead=config.daemon.max_chunks_ahead,
                incomplete_chunk_seconds=config.daemon.incomplete_chunk_seconds,
                on_chunk_ready=daemon.wake.set,
                outages=daemon.outages,
                events=event_stream(config),
            ),
        )
        daemon.ingest = worker
        worker.start()

    def stop(self) -> None:
        started(self.daemon.ingest, self.name).stop()


class SchedulerPart(DaemonPart):
    """The periodic jobs (service/scheduler.py): policy checks, the heartbeat, health."""

    name = "scheduler"
    # Its jobs write the heartbeat and check the ingest thread.
    requires = ("heartbeat", "ingest")

    def __init__(self, daemon: Daemon):
        super().__init__(daemon)
        self.scheduler: BackgroundScheduler | None = None

    def start(self) -> None:
        self.scheduler = build_scheduler(self.daemon, self.daemon.config.daemon.poll_seconds)
        self.scheduler.start()

    def stop(self) -> None:
        started(self.scheduler, self.name).shutdown(wait=True)


class MetricsPart(DaemonPart):
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``metrics.port`` (none when it is 0)."""

    name = "metrics"
    # After the threads, so that it stops before them: a stopping daemon's port closes at once. A port
    # that is taken fails the start, and the parts started before it are stopped.
    requires = ("scheduler",)

    def start(self) -> None:
        metrics = self.daemon.config.metrics
        if metrics.port:
            self.daemon.health.exporter = start_exporter(metrics.port, metrics.host)

    def stop(self) -> None:
        if self.daemon.health.exporter is not None:
            self.daemon.health.exporter.stop()


class HealthPart(DaemonPart):
    """Ready (``/readyz``) once every other part runs; at a stop, the first to say so (the phase ``stopping``)."""

    name = "health"
    requires = ("metrics", "publisher", "signals")

    def start(self) -> None:
        if self.daemon.health.exporter is not None:
            self.daemon.health.exporter.set_ready(True)
        self.daemon.set_phase("waiting")

    def stop(self) -> None:
        self.daemon.set_phase("stopping")


def daemon_parts(daemon: Daemon) -> list[Component]:
    """The daemon's parts, listed in the order they start (``requires`` keeps it so); the replay
    thread only with ``alma run --replay``."""
    return [
        FollowersPart(daemon),
        EnginePart(daemon),
        *([ReplayPart(daemon)] if daemon.replayer is not None else []),
        HeartbeatPart(daemon),
        SignalsPart(daemon),
        PublisherPart(daemon),
        IngestPart(daemon),
        SchedulerPart(daemon),
        MetricsPart(daemon),
        HealthPart(daemon),
    ]
