"""``alma run``: the long-lived service around the engine.

One record's path: ingest (``ingest/``, its own thread) stores parts in Redis and marks complete
chunks ready -> the main loop here takes the oldest ready chunk (``redis_buffer.ReadyChunks``) ->
``Engine.on_chunk`` (evaluate, buffer in ``RedisBuffer``, decide, train, checkpoint) -> one
MULTI/EXEC commits the step: the chunk leaves ``ready``, the buffer's membership and the engine and
policy states are saved together.

Resume: a step is either committed or not at all. After a crash the daemon reloads the committed
state, deletes the checkpoint an uncommitted stage may have written (version = committed + 1),
loads the checkpoint of the committed version and redoes the interrupted step. Every stage's
randomness derives from (seed, stage), so the redone step and the series equal an uninterrupted run.

Outages (docs/service.md, "Outages"): while Redis or the Kafka broker cannot be reached the daemon
keeps its process, reports itself degraded and waits with backoff (``outages.py``); when Redis is
back it checks that Redis still holds the stream (``stream_identity.py``) and resumes exactly as
after a crash, from the last committed step, in process. An outage longer than
``daemon.outage_limit_seconds`` ends the run with :class:`~alma_daemon.service.outages.OutageTooLong`.

Stopping: SIGTERM or Ctrl-C finishes the current step, then stops; a second signal abandons the
step at once (safe: it was not committed and is redone on restart). Every thread is stopped and
joined before :meth:`Daemon.run` returns, whatever failed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from alma_daemon.config import Config, to_dict
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.stream_task import StreamTask, load_stream_task
from alma_daemon.data.wire import RejectedRecord, StreamSchema
from alma_daemon.ingest.store import dead_letter, watched_transaction
from alma_daemon.ingest.worker import IngestWorker
from alma_daemon.observability import telemetry
from alma_daemon.observability.exporter import Exporter, MetricsObserver, start_exporter
from alma_daemon.observability.results import ResultsWriter, write_json_atomic
from alma_daemon.service.engine_store import EngineStateStore
from alma_daemon.service.outages import REDIS_UNREACHABLE, OutageBoard, one_line, retry_delays
from alma_daemon.service.redis_buffer import ReadyChunks, RedisBuffer
from alma_daemon.service.redis_keys import StreamKeys
from alma_daemon.service.scheduler import build_scheduler
from alma_daemon.service.stream_identity import RedisRestarted, StreamIdentity
from alma_daemon.transports import build_source
from serving import build_publisher
from serving.publisher import BackgroundPublisher

log = logging.getLogger(__name__)


class StepAbandoned(KeyboardInterrupt):
    """A second stop signal arrived during a step; the step is dropped and redone on restart."""


class IngestFailed(RuntimeError):
    """The ingest thread stopped with an error; the daemon stops with it."""


# -- what the daemon serves -----------------------------------------------------------------------
def stream_schema(task: TaskInfo) -> StreamSchema:
    """What ingest accepts: examples of the task's input shape with labels in its class range, or
    token runs of the task's vocabulary for a language model."""
    if task.kind == "language_model":
        return StreamSchema("text", vocab_size=task.num_classes)
    return StreamSchema("labeled", task.input_shape, num_classes=task.num_classes)


def daemon_observers(config: Config) -> list[EngineObserver]:
    """The observers every daemon attaches to its engine. Serving publishers and the metrics exporter
    are added here."""
    return [ResultsWriter(config.daemon.state_dir, to_dict(config))]


class CheckpointClock(EngineObserver):
    """Remembers when each checkpoint was written. The daemon hands a version to the publisher only
    once its step is committed: a crash before the commit deletes and redoes that checkpoint, so it
    must not be served first."""

    def __init__(self) -> None:
        self.written_at: dict[int, float] = {}

    def on_checkpoint(self, version: int, path: str, metrics: dict, engine: Engine) -> None:
        self.written_at[version] = time.monotonic()

    def take(self) -> list[tuple[int, float]]:
        """The checkpoints written since the last call, oldest first."""
        written, self.written_at = sorted(self.written_at.items()), {}
        return written


def load_json(client: Any, key: str) -> dict | None:
    raw = client.get(key)
    return json.loads(raw) if raw is not None else None


#: How long a run that reached its --until-chunks target waits for the last version to be published.
PUBLISH_DRAIN_SECONDS = 120.0
#: ``<daemon.state_dir>/STATUS_FILE``: the daemon's status, readable by ``alma status`` while Redis is down.
STATUS_FILE = "daemon-status.json"


def redis_name(config: Config) -> str:
    """Where Redis is, for messages: host:port, or the embedded server's database file."""
    if config.redis.url:
        from alma_daemon.service.connections import redis_server

        return redis_server(config.redis.url)
    from alma_daemon.service.embedded_redis import embedded_db_path

    return f"the embedded server ({embedded_db_path(config)})"


# -- the daemon -----------------------------------------------------------------------------------
class Daemon:
    """Ingest beside the engine, periodic jobs, clean stop, exact resume."""

    def __init__(
        self,
        config: Config,
        client: Any,
        *,
        until_chunks: int | None = None,
        observers: list[EngineObserver] | tuple[EngineObserver, ...] = (),
    ):
        self.config = config
        self.client = client
        self.keys = StreamKeys(config.daemon.stream)
        self.state_store = EngineStateStore(client, self.keys)
        self.until_chunks = until_chunks
        self.extra_observers = list(observers)
        self.ready = ReadyChunks(client, self.keys)
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.policy_check_due = threading.Event()
        self.healthy = True
        self.schema: StreamSchema | None = None
        self.engine: Engine | None = None
        self.buffer: RedisBuffer | None = None
        self.ingest: IngestWorker | None = None
        self.metrics = MetricsObserver()
        self.exporter: Exporter | None = None
        self.publisher: BackgroundPublisher | None = build_publisher(config)
        self.checkpoint_clock = CheckpointClock()
        self.outages = OutageBoard(config.daemon.outage_limit_seconds)
        self._riding_out = threading.Event()
        self.identity: StreamIdentity | None = None
        self._task: StreamTask | None = None
        self._in_step = False
        self._phase = "starting"

    # -- start-up ---------------------------------------------------------------------------------
    def restore(self) -> Engine:
        """The engine as the last committed step left it (a fresh one on first start)."""
        config = self.config
        if self._task is None:
            self._task = load_stream_task(config)
        task, test = self._task.task, self._task.test
        self.schema = stream_schema(task)
        if task.kind == "language_model":
            self.ready = ReadyChunks(self.client, self.keys, seq_len=task.input_shape[0])
        store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
        if self.identity is None:
            self.identity = StreamIdentity(self.client, self.keys, store, redis_name(config))
            self.identity.establish()
        state = self.state_store.load()
        version = state.model_version if state is not None else 0
        self._drop_uncommitted_checkpoints(store, version)
        if version and version not in store.versions():
            raise RuntimeError(
                f"the engine state in Redis ({self.keys.engine}) is at model version {version}, "
                f"but {store.folder} holds no complete version {version}"
            )
        self.buffer = RedisBuffer(self.client, self.keys)
        self.engine = assemble_engine(
            config,
            task,
            self.buffer,
            test_set=test,
            checkpoints=store,
            state=state,
            policy_state=load_json(self.client, self.keys.policy),
            observers=[*daemon_observers(config), self.metrics, self.checkpoint_clock, *self.extra_observers],
        )
        self.metrics.sync(self.engine)
        log.info(
            "engine restored",
            extra={
                "chunks_seen": self.engine.state.chunks_seen,
                "model_version": version,
                "pending": len(self.buffer.pending_chunks()),
            },
        )
        return self.engine

    @staticmethod
    def _drop_uncommitted_checkpoints(store: CheckpointStore, version: int) -> None:
        newer = [v for v in store.versions() if v > version]
        if not newer:
            return
        if newer != [version + 1]:
            raise RuntimeError(
                f"{store.folder} holds versions {newer} newer than the committed model version "
                f"{version}: Redis has lost recent commits (restore it with its AOF), or the "
                f"versions belong to another run (use another daemon.checkpoint_dir)"
            )
        # Written by a stage whose step was never committed; the redone step writes it again.
        log.warning("removing checkpoint of an uncommitted stage", extra={"version": newer[0]})
        shutil.rmtree(store.path(newer[0]))

    # -- the main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (signal, :meth:`request_stop`) or ``until_chunks`` chunks are processed."""
        if self.engine is None:
            self.restore()
        assert self.schema is not None
        self.ingest = IngestWorker(
            build_source(self.config, self.client),
            self.client,
            self.keys,
            self.schema,
            max_buffer_bytes=self.config.redis.max_buffer_bytes,
            on_chunk_ready=self.wake.set,
            outages=self.outages,
        )
        scheduler = build_scheduler(self, self.config.daemon.poll_seconds)
        previous = self._install_signal_handlers()
        self.client.hset(self.keys.daemon, mapping={"pid": os.getpid(), "started_at": f"{time.time():.3f}"})
        if self.config.metrics.port:
            self.exporter = start_exporter(self.config.metrics.port, self.config.metrics.host)
        try:
            if self.publisher is not None:
                self.publisher.start()
            self.ingest.start()
            scheduler.start()
            if self.exporter is not None:
                self.exporter.set_ready(True)
            self._set_phase("waiting")
            while not self.stop_requested.is_set() and not self._target_reached():
                try:
                    self._serve_once()
                except REDIS_UNREACHABLE as error:
                    self._ride_out_redis(error)
                except Exception:
                    # A step can fail on data that a restarted Redis no longer holds (a buffered
                    # chunk, say) before its commit checks the restart: then the restart is the
                    # error to act on, and the step is redone or the stream refused.
                    if not self._redis_restarted_beneath():
                        raise
            if self.publisher is not None and not self.stop_requested.is_set():
                # A scripted run (--until-chunks) ends with its last version published; a stop on a
                # signal does not wait: the next start catches up on unpublished versions.
                self.publisher.wait_idle(PUBLISH_DRAIN_SECONDS)
        finally:
            self._shut_down(scheduler, previous)

    def _serve_once(self) -> None:
        """One turn of the main loop: a ready chunk, a due policy check, or a short wait."""
        self.outages.check_limit()
        self._check_ingest()
        assert self.identity is not None
        if self.identity.restarted():
            # Redis may have lost its last second of writes (AOF everysec): continue from what it holds.
            log.warning("Redis restarted: resuming from its last committed step")
            self._reload_committed()
        chunk_id = self.ready.first()
        if chunk_id is not None:
            self._step(lambda: self._process_chunk(chunk_id))
        elif self.policy_check_due.is_set():
            self.policy_check_due.clear()
            self._step(self._policy_tick)
        else:
            self.wake.wait(self.config.daemon.poll_seconds)
            self.wake.clear()

    def _shut_down(self, scheduler: Any, previous_handlers: dict) -> None:
        """Stop and join every thread, each step on its own, so that one failing (Redis being down,
        say) does not leave a thread running. A thread still inside torch when the interpreter
        exits is ended mid-call by CPython (``pthread_exit``), which aborts the process in C++
        ("terminate called without an active exception")."""
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("exporter", lambda: self.exporter.stop() if self.exporter is not None else None),
            ("phase", lambda: self._set_phase("stopping")),
            ("scheduler", lambda: scheduler.shutdown(wait=True)),
            ("ingest", lambda: self.ingest.stop() if self.ingest is not None else None),
            ("publisher", lambda: self.publisher.close(PUBLISH_DRAIN_SECONDS) if self.publisher is not None else None),
            ("signals", lambda: self._restore_signal_handlers(previous_handlers)),
            ("phase", lambda: self._set_phase("stopped")),
            ("status", self.write_status),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as exc:
                log.warning("shutdown step failed", extra={"step": name, "error": one_line(exc)})

    # -- outages ----------------------------------------------------------------------------------
    def _ride_out_redis(self, error: BaseException) -> None:
        """Redis failed mid-loop: stay degraded until it answers again, then reload the committed
        state and continue as a restarted daemon would (the interrupted step is redone)."""
        self._in_step = False
        self._riding_out.set()
        try:
            self._wait_for_redis(error)
        finally:
            self._riding_out.clear()
        self._report_health()

    def _wait_for_redis(self, error: BaseException) -> None:
        outage = self.outages.down("redis", error)
        log.warning(
            "Redis unreachable: the daemon is degraded and waits for it",
            extra={
                "redis": redis_name(self.config),
                "error": outage.reason,
                "limit_seconds": self.config.daemon.outage_limit_seconds,
            },
        )
        self._report_health()
        delays, failures = retry_delays(), 0
        while True:
            self.outages.check_limit()
            if self.stop_requested.wait(delays.compute(failures)):
                return
            failures += 1
            try:
                assert self.identity is not None
                self.identity.restarted()
                self._reload_committed()
            except REDIS_UNREACHABLE as again:
                self.outages.down("redis", again)
                continue
            break
        ended = self.outages.up("redis")
        log.warning(
            "Redis is back: resumed from the last committed step",
            extra={
                "outage_seconds": round(time.time() - ended.since, 1) if ended else None,
                "chunks_seen": self.engine.state.chunks_seen if self.engine else None,
            },
        )

    def _redis_restarted_beneath(self) -> bool:
        assert self.identity is not None
        try:
            restarted = self.identity.restarted()
        except REDIS_UNREACHABLE:
            return False
        if restarted:
            log.warning("Redis restarted during the step: redoing it from the last committed step")
            self._reload_committed()
        return restarted

    def _reload_committed(self) -> None:
        """The engine, buffer and checkpoints as the last committed step left them, as at start-up."""
        self.checkpoint_clock.take()  # written by the interrupted step: deleted now and redone
        self.engine = None
        engine = self.restore()
        if self.publisher is not None and engine.state.model_version:
            self.publisher.submit(engine.state.model_version)  # in case the commit's hand-off was cut

    def _target_reached(self) -> bool:
        return (
            self.until_chunks is not None
            and self.engine is not None
            and self.engine.state.chunks_seen >= self.until_chunks
        )

    def _check_ingest(self) -> None:
        assert self.ingest is not None
        if self.ingest.error is not None:
            raise IngestFailed(f"ingest stopped: {self.ingest.error!r}") from self.ingest.error

    def _step(self, work: Callable[[], None]) -> None:
        self._in_step = True
        try:
            work()
        finally:
            self._in_step = False
            self._set_phase("waiting")

    def _process_chunk(self, chunk_id: int) -> None:
        engine = self.engine
        assert engine is not None
        if chunk_id <= engine.state.last_chunk:
            self._discard(
                chunk_id,
                RejectedRecord(
                    "chunk_order",
                    f"chunk {chunk_id} is ready but the engine already processed chunk {engine.state.last_chunk}",
                ),
            )
            return
        try:
            chunk = self.ready.load(chunk_id)
        except RejectedRecord as rejection:
            self._discard(chunk_id, rejection)
            return
        self._set_phase(f"processing chunk {chunk_id}")
        engine.on_chunk(chunk)
        self._commit(consumed=chunk_id)

    def _policy_tick(self) -> None:
        engine = self.engine
        assert engine is not None
        before = json.dumps(engine.policy.state_dict(), sort_keys=True)
        self._set_phase("policy check")
        stage = engine.on_tick()
        if stage is not None or json.dumps(engine.policy.state_dict(), sort_keys=True) != before:
            self._commit(consumed=None)

    def _commit(self, consumed: int | None) -> None:
        """Save the step: chunk out of ``ready``, buffer membership, engine and policy state, atomically."""
        engine, buffer = self.engine, self.buffer
        assert engine is not None and buffer is not None
        # From here the step is as good as done: a second signal must not cut the transaction short.
        self._in_step = False
        assert self.identity is not None
        pipe = watched_transaction(self.client, self.keys.engine)
        if self.identity.restarted():
            # This step's chunk and the buffer it trained on may be gone: redo it from what Redis holds.
            raise RedisRestarted("Redis restarted while the step ran; the step is redone")
        if consumed is not None:
            self.ready.stage_consume(pipe, consumed)
        buffer.stage_commit(pipe)
        self.state_store.stage_save(pipe, engine.state)
        pipe.set(self.keys.policy, json.dumps(engine.policy.state_dict()))
        pipe.execute()
        buffer.committed()
        self.state_store.committed()
        self._update_gauges()
        for version, written_at in self.checkpoint_clock.take():
            if self.publisher is not None:
                self.publisher.submit(version, written_at=written_at)

    def _discard(self, chunk_id: int, rejection: RejectedRecord) -> None:
        pipe = watched_transaction(self.client, self.keys.engine)
        self.ready.stage_consume(pipe, chunk_id)
        dead_letter(pipe, self.keys, rejection.reason, rejection.detail, f"chunk {chunk_id}")
        pipe.execute()
        telemetry.RECORDS_REJECTED.labels(rejection.reason).inc()
        log.warning(
            "ready chunk rejected", extra={"chunk": chunk_id, "reason": rejection.reason, "detail": rejection.detail}
        )

    # -- periodic jobs (called from the scheduler's thread) ---------------------------------------
    def request_policy_check(self) -> None:
        """Ask the main loop to let the policy decide between chunks (time-based policies)."""
        self.policy_check_due.set()
        self.wake.set()

    def write_status(self) -> None:
        """Heartbeat, phase and health in ``alma:{s}:daemon`` (read by ``alma status``) and in
        ``<state_dir>/daemon-status.json`` (read by ``alma status`` while Redis is down)."""
        try:
            self.client.hset(self.keys.daemon, mapping=self._status())
            self._update_gauges()
        except REDIS_UNREACHABLE as exc:
            self.outages.down("redis", exc)
        self._report_health()
        write_json_atomic(Path(self.config.daemon.state_dir) / STATUS_FILE, self._status())

    def _status(self) -> dict:
        return {
            "pid": os.getpid(),
            "phase": self._phase,
            "heartbeat": f"{time.time():.3f}",
            "rss_bytes": psutil.Process().memory_info().rss,
            "healthy": int(self.healthy),
            "ingest": self._ingest_state(),
            "degraded": json.dumps(self.outages.as_status()),
        }

    def _ingest_state(self) -> str:
        if self.ingest is None or not self.ingest.alive:
            return "stopped"
        return "paused" if self.ingest.paused else "running"

    def check_health(self) -> None:
        """Healthy while Redis answers, the ingest thread runs and no server is down; ``/readyz``
        says the same."""
        try:
            self.client.ping()
        except REDIS_UNREACHABLE as exc:
            self.outages.down("redis", exc)
        else:
            if not self._riding_out.is_set():  # the main loop declares Redis back after reloading
                self.outages.up("redis")
        self._report_health()

    def _report_health(self) -> None:
        ingest_ok = self.ingest is not None and self.ingest.alive
        healthy = ingest_ok and not self.outages.degraded
        if self.healthy != healthy and self._phase not in ("stopping", "stopped"):
            log.warning("health changed", extra={"healthy": healthy, "ingest": ingest_ok, **self.outages.as_status()})
        self.healthy = healthy
        if self.exporter is not None:
            self.exporter.set_ready(healthy)

    def _update_gauges(self) -> None:
        buffered = self.ready.count()
        if self.buffer is not None:
            buffered += len(self.buffer.pending_chunks()) + len(self.buffer.kept_chunks())
        telemetry.BUFFER_CHUNKS.set(buffered)

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        try:
            self.client.hset(self.keys.daemon, mapping={"phase": phase, "phase_since": f"{time.time():.3f}"})
        except REDIS_UNREACHABLE as exc:
            # Status only: the main loop notices the outage at its next Redis call.
            self.outages.down("redis", exc)

    # -- signals ----------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop_requested.set()
        self.wake.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_requested.is_set() and self._in_step:
            raise StepAbandoned(f"signal {signal.Signals(signum).name}: current step abandoned, redone on restart")
        log.warning(
            "stopping after the current step (signal again to abandon it)",
            extra={"signal": signal.Signals(signum).name},
        )
        self.request_stop()

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
