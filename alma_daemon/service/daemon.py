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
periodic jobs), ``rank_followers.py`` (under torchrun, the other ranks run each step with this one),
``loop_control.py`` (what the other threads may ask of the main loop).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from alma_daemon import metrics
from alma_daemon.config import Config, ConfigError
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.wire import RejectedRecord
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard
from alma_daemon.service.components import Component, started
from alma_daemon.service.daemon_parts import DaemonParts
from alma_daemon.service.embedded_redis import redis_name
from alma_daemon.service.gauges import update_buffer_gauge
from alma_daemon.service.loop_control import LoopControl
from alma_daemon.service.rank_followers import RankLeader
from alma_daemon.service.redis_buffer import RedisBuffer
from alma_daemon.service.redis_outage import RedisOutage
from alma_daemon.service.reorder import NextChunk, ReorderGate
from alma_daemon.service.replay_thread import ReplayThread
from serving.publishing.retention import prune_after_commit

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
        observers: Sequence[EngineObserver] = (),
        followers: RankLeader | None = None,
        on_waiting: Callable[[str], None] = lambda waiting_for: None,
        replay: bool = False,
        outer: Sequence[Component] = (),
    ):
        """``on_waiting`` is told what the daemon waits for whenever that changes (empty: it works),
        for the progress bar. ``replay``: publish the configured dataset into the stream from a
        thread (``alma run --replay``). ``outer``: components the graph starts before the daemon's
        parts and stops after them (``alma run``: the model store's lock, Redis, the progress bar;
        ``client`` is then the Redis component's, ``embedded_redis.ClientOf``)."""
        self.config = config
        self.until_chunks = until_chunks
        self.loop = LoopControl()
        self.outages = OutageBoard(config.daemon.outage_limit_seconds, server_addresses(config))
        self.reorder = ReorderGate(config.daemon.reorder_wait_seconds)
        self.parts = DaemonParts(
            config,
            client,
            outages=self.outages,
            loop=self.loop,
            followers=followers or RankLeader(),
            observers=observers,
            on_waiting=on_waiting,
            replay=replay,
            outer=outer,
        )
        self.redis_outage = RedisOutage(
            self.outages,
            self.loop.stop_requested,
            self._reload_committed,
            self.parts.heartbeat.report_health,
            redis_name(config),
            config.daemon.outage_limit_seconds,
        )
        #: Whether the main loop ended without an error, and the replay (if any) without one.
        self.ended_cleanly = False

    @property
    def engine(self) -> Engine:
        return self.parts.engine.engine

    @property
    def buffer(self) -> RedisBuffer:
        return self.parts.engine.buffer

    @property
    def store(self) -> CheckpointStore:
        return self.parts.engine.store

    @property
    def replayer(self) -> ReplayThread | None:
        """``alma run --replay``'s thread; None without it."""
        return self.parts.replay.replayer if self.parts.replay is not None else None

    # -- start-up ---------------------------------------------------------------------------------
    def restore(self) -> Engine:
        """The engine as the last committed step left it, before the run (the engine part's start
        then keeps it), for a caller that reads the state first."""
        return self.parts.engine.restore()

    # -- the main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (signal, :meth:`request_stop`) or ``until_chunks`` chunks are processed.

        The parts start first; a start-up that fails half way (Redis down, the metrics port taken)
        stops those it started. Every part is stopped before this returns, whatever failed."""
        self.parts.start()
        try:
            while not self.loop.stop_requested.is_set() and not self._target_reached():
                try:
                    self._serve_once()
                except REDIS_UNREACHABLE as error:
                    self._ride_out_redis(error)
                except Exception as error:
                    # A step can fail on data that a restarted Redis no longer holds: then the restart
                    # is the error to act on, and the step is redone or the stream refused.
                    if not self.redis_outage.restarted_beneath(self.parts.engine.identity, error):
                        raise
            if not self.loop.stop_requested.is_set():
                # A scripted run (--until-chunks) ends with its last version published; a stop on a
                # signal does not wait: the next start catches up on unpublished versions.
                self.parts.publisher.handoff.drain(on_wait=lambda what: self.set_phase("waiting", what, shown=True))
            self.ended_cleanly = True
        finally:
            self.parts.stop()

    def _serve_once(self) -> None:
        """One turn of the main loop: a ready chunk, a due policy check, or a short wait."""
        loop, ready = self.loop, self.parts.engine.ready
        self.outages.check_limit()
        self._check_ingest()
        if self.parts.engine.identity.restarted():
            # Redis may have lost its last second of writes (AOF everysec): continue from what it holds.
            log.warning("Redis restarted: resuming from its last committed step")
            self._reload_committed()
            ready = self.parts.engine.ready
        choice = self.reorder.choose(
            ready.ids(), self.engine.state.last_chunk, ready.lowest_assembling(), time.monotonic()
        )
        self._report_gap(choice)
        if choice.missing is not None:
            self.set_phase("waiting", f"missing chunk {choice.missing}", shown=True)
        elif choice.take is None and not loop.policy_check_due.is_set():
            waiting_for, shown = self._waiting_for()
            self.set_phase("waiting", waiting_for, shown=shown)
        if choice.take is not None:
            chunk_id = choice.take
            self._step(lambda: self._process_chunk(chunk_id))
        elif loop.policy_check_due.is_set():
            loop.policy_check_due.clear()
            self._step(self._policy_tick)
        else:
            loop.wake.wait(min(self.config.daemon.poll_seconds, choice.wait_left or float("inf")))
            loop.wake.clear()

    def _report_gap(self, choice: NextChunk) -> None:
        metrics.CHUNKS_WAITING_ON_GAP.set(choice.waiting)
        if choice.missing is None or self.parts.heartbeat.heartbeat.waiting_for == f"missing chunk {choice.missing}":
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
        """The phase for ``alma status`` (heartbeat), and a wait ``shown`` for the progress bar
        (``heartbeat.Phases``)."""
        self.parts.heartbeat.phases.set(phase, waiting_for, shown=shown, redis_down=redis_down)

    def _ride_out_redis(self, error: BaseException) -> None:
        """Redis failed mid-loop: stay degraded until it answers again, then continue as a restarted
        daemon would (the interrupted step is redone)."""
        heartbeat = self.parts.heartbeat
        self.loop.in_step = False
        heartbeat.health.riding_out.set()
        self.set_phase("waiting", self.outages.down("redis", error).describe(), shown=True, redis_down=True)
        try:
            self.redis_outage.wait_for_redis(error, self.parts.engine.identity)
        finally:
            heartbeat.health.riding_out.clear()
        self.set_phase("waiting")
        heartbeat.report_health()

    def _reload_committed(self) -> Engine:
        """The engine, buffer and checkpoints as the last committed step left them, as at start-up.

        The publisher forgets what was handed over before the checkpoints are dropped (see
        :func:`serving.publishing.live_pointer.withdraw`, which waits for the serving lock)."""
        handoff = self.parts.publisher.handoff
        handoff.reloading()
        engine = self.parts.engine.reload()
        handoff.reloaded(engine.state.model_version)
        return engine

    def _target_reached(self) -> bool:
        return (
            self.until_chunks is not None
            and self.parts.engine.restored
            and self.engine.state.chunks_seen >= self.until_chunks
        )

    def _check_ingest(self) -> None:
        error = started(self.parts.ingest.worker, "ingest").error
        if isinstance(error, ConfigError):
            raise error  # e.g. a refused Kafka login, met when the transport first connects
        if error is not None:
            raise IngestFailed(f"ingest stopped: {error!r}") from error

    def _step(self, work: Callable[[], None]) -> None:
        self.loop.in_step = True
        try:
            work()
        finally:
            self.loop.in_step = False
            self.set_phase("waiting")

    def _process_chunk(self, chunk_id: int) -> None:
        engine, buffer = self.engine, self.buffer
        steps, ready = self.parts.engine.steps, self.parts.engine.ready
        if chunk_id == engine.state.last_chunk or chunk_id in buffer.pending_chunks() + buffer.kept_chunks():
            detail = f"chunk {chunk_id} is ready but the engine already took it"
            steps.discard(ready, chunk_id, RejectedRecord("chunk_order", detail))
            return
        try:
            chunk = ready.load(chunk_id)
        except RejectedRecord as rejection:
            steps.discard(ready, chunk_id, rejection)
            return
        self.set_phase(f"processing chunk {chunk_id}")
        with self.parts.followers.followers.step(engine, chunk):
            engine.on_chunk(chunk)
        self._commit(consumed=chunk_id)

    def _policy_tick(self) -> None:
        # Under torchrun the other ranks follow chunks only: a stage between chunks would leave them
        # out of its collectives, so there every decision (the freshness bound's too) waits for a chunk.
        if not self.parts.followers.followers.alone:
            return
        engine = self.engine
        before = json.dumps(engine.policy.state_dict(), sort_keys=True)
        self.set_phase("policy check")
        stage = engine.on_tick()
        if stage is not None or json.dumps(engine.policy.state_dict(), sort_keys=True) != before:
            self._commit(consumed=None)

    def _commit(self, consumed: int | None) -> None:
        engine, buffer = self.engine, self.buffer
        steps, ready = self.parts.engine.steps, self.parts.engine.ready
        # From here the step is as good as done: a second signal must not cut the transaction short.
        self.loop.in_step = False
        steps.commit(engine, buffer, ready, consumed)
        update_buffer_gauge(ready, buffer)
        self.parts.publisher.handoff.committed()
        if self.config.serving.kind == "none":  # else the publisher prunes, after each of its rulings
            prune_after_commit(self.store, self.config.daemon.keep_checkpoints)

    # -- stopping ---------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.loop.request_stop()
