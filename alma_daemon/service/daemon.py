"""``alma run``: the long-lived service around the engine; :class:`Daemon` runs its parts and its main loop.

One record's path: ingest (``service/ingest/``, its own thread) stores parts in Redis and marks complete
chunks ready -> the main loop here takes the oldest ready chunk (``redis_buffer.ReadyChunks``) ->
``Engine.on_chunk`` (evaluate, buffer in ``RedisBuffer``, decide, train, checkpoint) -> one
MULTI/EXEC commits the step (``step_commit.py``) -> the new version goes to the publisher
(``publish_handoff.py``). See docs/architecture.md for the threads and who owns what.

The daemon's parts (``daemon_parts.py``: followers, engine, replay, heartbeat, signals, publisher,
ingest, scheduler, metrics, health) are components (``components.py``) that start in dependency
order and stop in reverse, each stop on its own, whatever failed. The modules, one job each:
``bootstrap.py`` (the engine as the last committed step left it, resume after a crash), ``step_commit.py`` (the commit, dead-lettering), ``redis_outage.py`` (riding out
Redis), ``heartbeat.py`` (status in Redis and on disk), ``health.py`` (health and ``/readyz``),
``gauges.py``, ``signals.py`` (stop signals), ``publish_handoff.py`` and ``scheduler.py`` (the
periodic jobs), ``rank_followers.py`` (under torchrun, the other ranks run each step with this one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from alma_daemon.config import Config, ConfigError
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.stream_task import StreamTask, load_stream_task
from alma_daemon.data.wire import RejectedRecord, StreamSchema
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability import telemetry
from alma_daemon.observability.exporter import MetricsObserver
from alma_daemon.service.bootstrap import redis_location, redis_name, restore_engine, stream_schema
from alma_daemon.service.components import ComponentGraph, started
from alma_daemon.service.daemon_parts import daemon_parts
from alma_daemon.service.engine_store import EngineStateStore
from alma_daemon.service.gauges import update_buffer_gauge
from alma_daemon.service.health import Health
from alma_daemon.service.heartbeat import STATUS_FILE, Heartbeat
from alma_daemon.service.ingest.worker import IngestWorker
from alma_daemon.service.publish_handoff import PublishHandoff
from alma_daemon.service.rank_followers import RankLeader
from alma_daemon.service.redis_buffer import ReadyChunks, RedisBuffer
from alma_daemon.service.redis_outage import RedisOutage
from alma_daemon.service.reorder import NextChunk, ReorderGate
from alma_daemon.service.replay_thread import ReplayThread
from alma_daemon.service.signals import StopSignals
from alma_daemon.service.step_commit import StepCommit
from alma_daemon.service.stream_identity import StreamIdentity
from serving import build_publisher
from serving.retention import prune_after_commit

log = logging.getLogger(__name__)


class IngestFailed(RuntimeError):
    """The ingest thread stopped with an error; the daemon stops with it."""


def server_addresses(config: Config) -> dict[str, str]:
    """Where the servers the daemon depends on are, for messages naming them (infra/unreachable.py)."""
    addresses = {"redis": redis_name(config)}
    if config.kafka.transport == "kafka":
        addresses["kafka"] = config.kafka.bootstrap_servers
    return addresses


class Daemon:
    """Ingest beside the engine, periodic jobs, clean stop, exact resume: the parts of
    ``daemon_parts.py`` run as a graph around the main loop here."""

    def __init__(
        self,
        config: Config,
        client: Any,
        *,
        until_chunks: int | None = None,
        observers: list[EngineObserver] | tuple[EngineObserver, ...] = (),
        followers: RankLeader | None = None,
        on_waiting: Callable[[str], None] = lambda waiting_for: None,
        replay: bool = False,
    ):
        """``on_waiting`` is told what the daemon waits for whenever that changes (empty: it works),
        for the progress bar. ``replay``: publish the configured dataset into the stream from a
        thread (``alma run --replay``)."""
        self.config = config
        self.client = client
        self.keys = StreamKeys(config.daemon.stream)
        self.state_store = EngineStateStore(client, self.keys, config.daemon.series_rows)
        self.until_chunks = until_chunks
        self.extra_observers = list(observers)
        #: The other ranks under torchrun (service/rank_followers.py); alone, it does nothing.
        self.followers = followers or RankLeader()
        self.ready = ReadyChunks(client, self.keys)
        self.reorder = ReorderGate(config.daemon.reorder_wait_seconds)
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.policy_check_due = threading.Event()
        #: Set by :meth:`restore` (the schema, engine and buffer) and by the ingest part.
        self.schema: StreamSchema | None = None
        self._engine: Engine | None = None
        self._buffer: RedisBuffer | None = None
        self.ingest: IngestWorker | None = None
        self.metrics = MetricsObserver()
        self.handoff = PublishHandoff(build_publisher(config))
        self.outages = OutageBoard(config.daemon.outage_limit_seconds, server_addresses(config))
        self.on_waiting = on_waiting
        self._shown_wait = ""
        self.health = Health(client, self.outages)
        self.heartbeat = Heartbeat(client, self.keys, Path(config.daemon.state_dir) / STATUS_FILE, self.outages)
        self.signals = StopSignals(self.stop_requested, self.request_stop, lambda: self._in_step)
        self.redis_outage = RedisOutage(
            self.outages,
            self.stop_requested,
            self._reload_committed,
            self._report_health,
            redis_name(config),
            config.daemon.outage_limit_seconds,
        )
        self.store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
        self.identity = StreamIdentity(client, self.keys, self.store, redis_name(config), redis_location(config))
        self.steps = StepCommit(client, self.keys, self.state_store, self.identity)
        self.replayer = (
            ReplayThread(config, client, self.stop_requested, on_failure=self.request_stop) if replay else None
        )
        self._in_step = False
        self.parts = ComponentGraph(daemon_parts(self))

    @property
    def engine(self) -> Engine:
        return started(self._engine, "engine")

    @property
    def buffer(self) -> RedisBuffer:
        return started(self._buffer, "engine")

    @property
    def restored(self) -> bool:
        """Whether the engine is restored (and not being reloaded)."""
        return self._engine is not None

    @cached_property
    def stream_task(self) -> StreamTask:
        """The task and the test set, read at the first restore."""
        return load_stream_task(self.config)

    # -- start-up ---------------------------------------------------------------------------------
    def restore(self) -> Engine:
        """The engine as the last committed step left it (a fresh one on first start); the first
        restore checks the stream's identity."""
        task = self.stream_task.task
        self.schema = stream_schema(task, self.config)
        if task.kind == "language_model":
            self.ready = ReadyChunks(self.client, self.keys, seq_len=task.input_shape[0])
        if self.identity.value is None:
            self.identity.establish()
        observers = [self.metrics, self.handoff.clock, self.followers, *self.extra_observers]
        engine, self._buffer = restore_engine(
            self.config, self.client, self.keys, self.state_store, self.stream_task, self.store, observers
        )
        self._engine = engine
        self.followers.engine_restored(engine, self._buffer)
        self.metrics.sync(engine)
        return engine

    # -- the main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (signal, :meth:`request_stop`) or ``until_chunks`` chunks are processed.

        The parts start first; a start-up that fails half way (Redis down, the metrics port taken)
        stops those it started. Every part is stopped before this returns, whatever failed."""
        self.parts.start()
        try:
            while not self.stop_requested.is_set() and not self._target_reached():
                try:
                    self._serve_once()
                except REDIS_UNREACHABLE as error:
                    self._ride_out_redis(error)
                except Exception as error:
                    # A step can fail on data that a restarted Redis no longer holds: then the restart
                    # is the error to act on, and the step is redone or the stream refused.
                    if not self.redis_outage.restarted_beneath(self.identity, error):
                        raise
            if not self.stop_requested.is_set():
                # A scripted run (--until-chunks) ends with its last version published; a stop on a
                # signal does not wait: the next start catches up on unpublished versions.
                self.handoff.drain(on_wait=lambda what: self.set_phase("waiting", what, shown=True))
        finally:
            self.parts.stop()

    def _serve_once(self) -> None:
        """One turn of the main loop: a ready chunk, a due policy check, or a short wait."""
        self.outages.check_limit()
        self._check_ingest()
        if self.identity.restarted():
            # Redis may have lost its last second of writes (AOF everysec): continue from what it holds.
            log.warning("Redis restarted: resuming from its last committed step")
            self._reload_committed()
        choice = self.reorder.choose(
            self.ready.ids(), self.engine.state.last_chunk, self.ready.lowest_assembling(), time.monotonic()
        )
        self._report_gap(choice)
        if choice.missing is not None:
            self.set_phase("waiting", f"missing chunk {choice.missing}", shown=True)
        elif choice.take is None and not self.policy_check_due.is_set():
            waiting_for, shown = self._waiting_for()
            self.set_phase("waiting", waiting_for, shown=shown)
        if choice.take is not None:
            chunk_id = choice.take
            self._step(lambda: self._process_chunk(chunk_id))
        elif self.policy_check_due.is_set():
            self.policy_check_due.clear()
            self._step(self._policy_tick)
        else:
            self.wake.wait(min(self.config.daemon.poll_seconds, choice.wait_left or float("inf")))
            self.wake.clear()

    def _report_gap(self, choice: NextChunk) -> None:
        telemetry.CHUNKS_WAITING_ON_GAP.set(choice.waiting)
        if choice.missing is None or self.heartbeat.waiting_for == f"missing chunk {choice.missing}":
            return
        log.info(
            "waiting for a missing chunk",
            extra={"missing": choice.missing, "ready": choice.waiting, "seconds_left": round(choice.wait_left or 0)},
        )

    def _waiting_for(self) -> tuple[str, bool]:
        """What the idle main loop waits for, and whether the progress bar shows it: a server that is
        down (shown), or the next chunk."""
        outages = self.outages.outages()
        if outages:
            return outages[0].describe(), True
        last = self.engine.state.last_chunk
        return (f"chunk {last + 1}" if last else "the first chunk"), False

    def set_phase(self, phase: str, waiting_for: str = "", *, shown: bool = False, redis_down: bool = False) -> None:
        """The phase for ``alma status`` (heartbeat).

        A wait ``shown`` goes to :attr:`on_waiting` too (a server down, a missing chunk, the last
        swap; not the next chunk, which the bar's stillness says) and stays there until another wait
        or a chunk replaces it: a policy check in between does not."""
        show = self._shown_wait
        if waiting_for or phase.startswith("processing"):
            show = waiting_for if shown else ""
        if show != self._shown_wait:
            self._shown_wait = show
            self.on_waiting(show)
        self.heartbeat.set_phase(phase, waiting_for, redis_down=redis_down)

    def _ride_out_redis(self, error: BaseException) -> None:
        """Redis failed mid-loop: stay degraded until it answers again, then continue as a restarted
        daemon would (the interrupted step is redone)."""
        self._in_step = False
        self.health.riding_out.set()
        self.set_phase("waiting", self.outages.down("redis", error).describe(), shown=True, redis_down=True)
        try:
            self.redis_outage.wait_for_redis(error, self.identity)
        finally:
            self.health.riding_out.clear()
        self.set_phase("waiting")
        self._report_health()

    def _reload_committed(self) -> Engine:
        """The engine, buffer and checkpoints as the last committed step left them, as at start-up.

        The publisher forgets what was handed over before the checkpoints are dropped (see
        :func:`serving.live_pointer.withdraw`, which waits for the serving lock)."""
        self._engine = None
        self.handoff.reloading()
        engine = self.restore()
        self.handoff.reloaded(engine.state.model_version)
        return engine

    def _target_reached(self) -> bool:
        return (
            self.until_chunks is not None
            and self._engine is not None
            and self._engine.state.chunks_seen >= self.until_chunks
        )

    def _check_ingest(self) -> None:
        error = started(self.ingest, "ingest").error
        if isinstance(error, ConfigError):
            raise error  # e.g. a refused Kafka login, met when the transport first connects
        if error is not None:
            raise IngestFailed(f"ingest stopped: {error!r}") from error

    def _step(self, work: Callable[[], None]) -> None:
        self._in_step = True
        try:
            work()
        finally:
            self._in_step = False
            self.set_phase("waiting")

    def _process_chunk(self, chunk_id: int) -> None:
        engine, steps, buffer = self.engine, self.steps, self.buffer
        if chunk_id == engine.state.last_chunk or chunk_id in buffer.pending_chunks() + buffer.kept_chunks():
            detail = f"chunk {chunk_id} is ready but the engine already took it"
            steps.discard(self.ready, chunk_id, RejectedRecord("chunk_order", detail))
            return
        try:
            chunk = self.ready.load(chunk_id)
        except RejectedRecord as rejection:
            steps.discard(self.ready, chunk_id, rejection)
            return
        self.set_phase(f"processing chunk {chunk_id}")
        with self.followers.step(engine, chunk):
            engine.on_chunk(chunk)
        self._commit(consumed=chunk_id)

    def _policy_tick(self) -> None:
        # Under torchrun the other ranks follow chunks only: a stage between chunks would leave them
        # out of its collectives, so there every decision (the freshness bound's too) waits for a chunk.
        if not self.followers.alone:
            return
        engine = self.engine
        before = json.dumps(engine.policy.state_dict(), sort_keys=True)
        self.set_phase("policy check")
        stage = engine.on_tick()
        if stage is not None or json.dumps(engine.policy.state_dict(), sort_keys=True) != before:
            self._commit(consumed=None)

    def _commit(self, consumed: int | None) -> None:
        engine, buffer, steps = self.engine, self.buffer, self.steps
        # From here the step is as good as done: a second signal must not cut the transaction short.
        self._in_step = False
        steps.commit(engine, buffer, self.ready, consumed)
        update_buffer_gauge(self.ready, buffer)
        self.handoff.committed()
        if self.config.serving.kind == "none":  # else the publisher prunes, after each of its rulings
            prune_after_commit(self.store, self.config.daemon.keep_checkpoints)

    # -- periodic jobs (called from the scheduler's thread) ---------------------------------------
    def request_policy_check(self) -> None:
        """Ask the main loop to let the policy decide between chunks (time-based policies)."""
        self.policy_check_due.set()
        self.wake.set()

    def write_status(self) -> None:
        """The heartbeat: status in ``alma:{s}:daemon`` and in ``<state_dir>/daemon-status.json``."""
        try:
            self.heartbeat.write_redis(self.health.healthy, self.ingest)
            update_buffer_gauge(self.ready, self._buffer)
        except REDIS_UNREACHABLE as exc:
            self.outages.down("redis", exc)
        self._report_health()
        self.heartbeat.write_file(self.health.healthy, self.ingest)

    def check_health(self) -> None:
        """Healthy while Redis answers, the ingest thread runs and no server is down."""
        self.health.check(self.ingest, quiet=self.heartbeat.stopping)

    def _report_health(self) -> None:
        self.health.report(self.ingest, quiet=self.heartbeat.stopping)

    # -- stopping ---------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop_requested.set()
        self.wake.set()
