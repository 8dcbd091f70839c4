"""The daemon's parts, each a component (service/components.py) that the daemon starts in dependency
order and stops in reverse; docs/architecture.md draws the graph.

A part owns what it opens and is built from the config and what it uses, passed in: the parts it
reads (``engine``, ``ingest``, ...), the shared outage board, the main loop's flags (``loop_control.py``).
No part is given the daemon, and none sets another's fields. :class:`DaemonParts` builds them all
and is their graph; adding a part is a class here and a line there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from alma_daemon.config import Config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.stream_task import StreamTask, load_stream_task
from alma_daemon.data.wire import StreamSchema
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability.exporter import Exporter, MetricsObserver, start_exporter
from alma_daemon.service.bootstrap import event_stream, restore_engine, stream_schema
from alma_daemon.service.components import Component, ComponentGraph, started
from alma_daemon.service.embedded_redis import redis_location, redis_name
from alma_daemon.service.engine_store import EngineStateStore
from alma_daemon.service.gauges import update_buffer_gauge
from alma_daemon.service.health import Health
from alma_daemon.service.heartbeat import STATUS_FILE, Heartbeat, Phases
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker
from alma_daemon.service.loop_control import LoopControl
from alma_daemon.service.publish_handoff import PublishHandoff
from alma_daemon.service.rank_followers import RankLeader
from alma_daemon.service.redis_buffer import ReadyChunks, RedisBuffer
from alma_daemon.service.redis_outage import StartupWait
from alma_daemon.service.replay_thread import ReplayThread
from alma_daemon.service.scheduler import build_scheduler
from alma_daemon.service.signals import StopSignals
from alma_daemon.service.status import freshness_bound
from alma_daemon.service.step_commit import StepCommit
from alma_daemon.service.stream_identity import StreamIdentity
from alma_daemon.transports import build_source
from serving.publishing import build_publisher


class FollowersPart(Component):
    """Under torchrun, the other ranks (service/rank_followers.py): they are handed the engine each
    time it is restored, and told to leave at the end."""

    name = "followers"

    def __init__(self, followers: RankLeader):
        #: The other ranks; alone, it does nothing.
        self.followers = followers

    def stop(self) -> None:
        self.followers.stop()


class EnginePart(Component):
    """The engine as the last committed step left it, once the stream's identity is checked; with it
    what the main loop's steps use: the ready chunks, the buffer, the step commit, the model store."""

    name = "engine"
    # A restore hands the followers the engine.
    requires = ("followers",)

    def __init__(
        self,
        config: Config,
        client: Any,
        followers: RankLeader,
        observers: Sequence[EngineObserver],
        startup: StartupWait,
    ):
        """``observers`` watch the engine beside its gauges on /metrics (``metrics``); ``startup`` waits
        out Redis during the first restore."""
        self.config = config
        self.client = client
        self.followers = followers
        self.observers = list(observers)
        self.startup = startup
        self.keys = StreamKeys(config.daemon.stream)
        self.store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
        self.state_store = EngineStateStore(client, self.keys, config.daemon.series_rows)
        self.identity = StreamIdentity(client, self.keys, self.store, redis_name(config), redis_location(config))
        self.steps = StepCommit(client, self.keys, self.state_store, self.identity)
        #: The ready chunks, read as the stream's task takes them (set again by :meth:`restore`).
        self.ready = ReadyChunks(client, self.keys)
        self.metrics = MetricsObserver()
        #: What ingest accepts, known once :meth:`restore` read the stream's task.
        self.schema: StreamSchema | None = None
        self._engine: Engine | None = None
        self._buffer: RedisBuffer | None = None

    @property
    def engine(self) -> Engine:
        return started(self._engine, self.name)

    @property
    def buffer(self) -> RedisBuffer:
        return started(self._buffer, self.name)

    @property
    def restored(self) -> bool:
        """Whether the engine is restored (and not being reloaded)."""
        return self._engine is not None

    @cached_property
    def stream_task(self) -> StreamTask:
        """The task and the test set, read at the first restore."""
        return load_stream_task(self.config)

    def start(self) -> None:
        if not self.restored:  # a caller may restore before the run, to read the state first
            self.startup.run(self.restore)

    def restore(self) -> Engine:
        """The engine as the last committed step left it (a fresh one on first start); the first
        restore checks the stream's identity."""
        task = self.stream_task.task
        self.schema = stream_schema(task, self.config)
        if task.kind == "language_model":
            self.ready = ReadyChunks(self.client, self.keys, seq_len=task.input_shape[0])
        if self.identity.value is None:
            self.identity.establish()
        engine, self._buffer = restore_engine(
            self.config,
            self.client,
            self.keys,
            self.state_store,
            self.stream_task,
            self.store,
            [self.metrics, *self.observers],
        )
        self._engine = engine
        self.followers.engine_restored(engine, self._buffer)
        self.metrics.sync(engine)
        return engine

    def reload(self) -> Engine:
        """:meth:`restore` again, after a Redis outage or restart; not :attr:`restored` meanwhile."""
        self._engine = None
        return self.restore()


class ReplayPart(Component):
    """``alma run --replay``: the dataset published into the stream from a thread of this process."""

    name = "replay"
    # Nothing is written into a stream before its identity is checked (a Redis that lost it is refused).
    requires = ("engine",)

    def __init__(self, config: Config, client: Any, loop: LoopControl):
        self.loop = loop
        self.replayer = ReplayThread(config, client, loop.stop_requested, on_failure=loop.request_stop)

    def start(self) -> None:
        self.replayer.start()

    def stop(self) -> None:
        self.loop.request_stop()  # the thread ends once the daemon stops
        self.replayer.stop()


class IngestPart(Component):
    """The ingest thread: records from the transport into Redis, exactly once."""

    name = "ingest"
    # It accepts what the stream's task takes (the schema), known once the engine is restored.
    requires = ("engine",)

    def __init__(
        self,
        config: Config,
        client: Any,
        engine: EnginePart,
        outages: OutageBoard,
        loop: LoopControl,
        startup: StartupWait,
    ):
        self.config = config
        self.client = client
        self.engine = engine
        self.outages = outages
        self.loop = loop
        self.startup = startup
        #: The thread's worker, once started (kept after its stop: its error, and that it ran).
        self.worker: IngestWorker | None = None

    def start(self) -> None:
        config, keys = self.config, self.engine.keys
        source = build_source(config, self.client)
        worker = self.startup.run(
            lambda: IngestWorker(
                source,
                self.client,
                keys,
                started(self.engine.schema, "engine"),
                IngestLimits.from_config(config),
                on_chunk_ready=self.loop.chunk_ready,
                outages=self.outages,
                events=event_stream(config),
            ),
        )
        self.worker = worker
        worker.start()

    def stop(self) -> None:
        started(self.worker, self.name).stop()


class MetricsPart(Component):
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``metrics.port`` (none when it is 0)."""

    name = "metrics"
    # After the threads, so that it stops before them: a stopping daemon's port closes at once. A port
    # that is taken fails the start, and the parts started before it are stopped.
    requires = ("scheduler",)

    def __init__(self, config: Config):
        self.port, self.host = config.metrics.port, config.metrics.host
        self.exporter: Exporter | None = None

    def start(self) -> None:
        if self.port:
            self.exporter = start_exporter(self.port, self.host)

    def stop(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()

    def set_ready(self, ready: bool) -> None:
        """What ``/readyz`` answers (nothing to tell without a port)."""
        if self.exporter is not None:
            self.exporter.set_ready(ready)


class HeartbeatPart(Component):
    """The daemon's pid, phase and status in ``alma:{s}:daemon`` and the status file, for ``alma
    status``; and its health (Redis answers, the ingest thread runs, no server is down), for ``/readyz``."""

    name = "heartbeat"
    requires = ("engine",)

    def __init__(
        self,
        config: Config,
        client: Any,
        phases: Phases,
        outages: OutageBoard,
        engine: EnginePart,
        ingest: IngestPart,
        metrics: MetricsPart,
        startup: StartupWait,
    ):
        self.bound = freshness_bound(config)
        self.phases = phases
        self.heartbeat = phases.heartbeat
        self.outages = outages
        self.engine = engine
        self.ingest = ingest
        self.startup = startup
        self.health = Health(client, outages, set_ready=metrics.set_ready)

    def start(self) -> None:
        self.startup.run(lambda: self.heartbeat.started(self.bound))

    def stop(self) -> None:
        try:
            self.phases.set("stopped")
        finally:
            self.beat()

    def beat(self) -> None:
        """The heartbeat: status in ``alma:{s}:daemon`` and in ``<state_dir>/daemon-status.json``."""
        ingest = self.ingest.worker
        try:
            self.heartbeat.write_redis(self.health.healthy, ingest)
            update_buffer_gauge(self.engine.ready, self.engine.buffer)
        except REDIS_UNREACHABLE as exc:
            self.outages.down("redis", exc)
        self.report_health()
        self.heartbeat.write_file(self.health.healthy, ingest)

    def check_health(self) -> None:
        """Healthy while Redis answers, the ingest thread runs and no server is down."""
        self.health.check(self.ingest.worker, quiet=self.heartbeat.stopping)

    def report_health(self) -> None:
        self.health.report(self.ingest.worker, quiet=self.heartbeat.stopping)


class SignalsPart(Component):
    """SIGTERM and Ctrl-C finish the step, then stop (service/signals.py)."""

    name = "signals"
    # A signal during the restore ends it at once: the handlers cover the main loop's steps.
    requires = ("engine",)

    def __init__(self, loop: LoopControl):
        self.signals = StopSignals(loop.stop_requested, loop.request_stop, lambda: loop.in_step)

    def start(self) -> None:
        self.signals.install()

    def stop(self) -> None:
        self.signals.restore()


class PublisherPart(Component):
    """The publisher's thread, which versions go to once their step is committed."""

    name = "publisher"
    # The restore withdraws the checkpoint of an uncommitted step before the publisher can see it.
    requires = ("engine",)

    def __init__(self, config: Config):
        self.handoff = PublishHandoff(build_publisher(config))

    def start(self) -> None:
        self.handoff.start()

    def stop(self) -> None:
        self.handoff.close()


class SchedulerPart(Component):
    """The periodic jobs (service/scheduler.py): policy checks, the heartbeat, health."""

    name = "scheduler"
    # Its jobs write the heartbeat and check the ingest thread.
    requires = ("heartbeat", "ingest")

    def __init__(self, config: Config, heartbeat: HeartbeatPart, policy_check: Callable[[], None]):
        self.poll_seconds = config.daemon.poll_seconds
        self.heartbeat = heartbeat
        self.policy_check = policy_check
        self.scheduler: BackgroundScheduler | None = None

    def start(self) -> None:
        self.scheduler = build_scheduler(
            self.poll_seconds,
            policy_check=self.policy_check,
            status=self.heartbeat.beat,
            health=self.heartbeat.check_health,
        )
        self.scheduler.start()

    def stop(self) -> None:
        started(self.scheduler, self.name).shutdown(wait=True)


class HealthPart(Component):
    """Ready (``/readyz``) once every other part runs; at a stop, the first to say so (the phase ``stopping``)."""

    name = "health"
    requires = ("metrics", "publisher", "signals")

    def __init__(self, metrics: MetricsPart, phases: Phases):
        self.metrics = metrics
        self.phases = phases

    def start(self) -> None:
        self.metrics.set_ready(True)
        self.phases.set("waiting")

    def stop(self) -> None:
        self.phases.set("stopping")


class DaemonParts(ComponentGraph):
    """The daemon's parts, each built from what it uses, as one graph: they start in the order listed
    (``requires`` keeps it so) and stop in reverse. ``outer`` components start before them all and stop
    after (``alma run``: the model store's lock, Redis, the progress bar); the replay thread only
    with ``alma run --replay``."""

    def __init__(
        self,
        config: Config,
        client: Any,
        *,
        outages: OutageBoard,
        loop: LoopControl,
        followers: RankLeader,
        observers: Sequence[EngineObserver] = (),
        on_waiting: Callable[[str], None] = lambda waiting_for: None,
        replay: bool = False,
        outer: Sequence[Component] = (),
    ):
        heartbeat = Heartbeat(
            client, StreamKeys(config.daemon.stream), Path(config.daemon.state_dir) / STATUS_FILE, outages
        )
        phases = Phases(heartbeat, on_waiting)
        startup = StartupWait(outages, phases.show_redis_down, config.daemon.poll_seconds)
        self.followers = FollowersPart(followers)
        self.publisher = PublisherPart(config)
        self.engine = EnginePart(
            config, client, followers, [self.publisher.handoff.clock, followers, *observers], startup
        )
        self.replay = ReplayPart(config, client, loop) if replay else None
        self.ingest = IngestPart(config, client, self.engine, outages, loop, startup)
        self.metrics = MetricsPart(config)
        self.heartbeat = HeartbeatPart(config, client, phases, outages, self.engine, self.ingest, self.metrics, startup)
        self.signals = SignalsPart(loop)
        self.scheduler = SchedulerPart(config, self.heartbeat, loop.request_policy_check)
        self.health = HealthPart(self.metrics, phases)
        super().__init__(
            [
                *outer,
                self.followers,
                self.engine,
                *([self.replay] if self.replay is not None else []),
                self.heartbeat,
                self.signals,
                self.publisher,
                self.ingest,
                self.scheduler,
                self.metrics,
                self.health,
            ]
        )
