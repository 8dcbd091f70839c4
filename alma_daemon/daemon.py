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

Stopping: SIGTERM or Ctrl-C finishes the current step, then stops; a second signal abandons the
step at once (safe: it was not committed and is redone on restart).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from typing import Any, Callable

import psutil

from alma_daemon import telemetry
from alma_daemon.checkpoints import CheckpointStore
from alma_daemon.config import Config, to_dict
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.wire import RejectedRecord, StreamSchema
from alma_daemon.engine import Engine, EngineObserver
from alma_daemon.engine_store import EngineStateStore
from alma_daemon.exporter import Exporter, MetricsObserver, start_exporter
from alma_daemon.ingest import IngestWorker, build_source
from alma_daemon.ingest.store import dead_letter
from alma_daemon.learners import build_learner
from alma_daemon.redis_buffer import ReadyChunks, RedisBuffer
from alma_daemon.redis_keys import StreamKeys
from alma_daemon.results import ResultsWriter
from alma_daemon.runtime import resolve_device
from alma_daemon.scheduler import build_scheduler
from policies import build_policy
from serving import build_publisher
from serving.publisher import BackgroundPublisher

log = logging.getLogger(__name__)


class StepAbandoned(KeyboardInterrupt):
    """A second stop signal arrived during a step; the step is dropped and redone on restart."""


class IngestFailed(RuntimeError):
    """The ingest thread stopped with an error; the daemon stops with it."""


# -- what the daemon serves -----------------------------------------------------------------------
def stream_task(config: Config) -> tuple[TaskInfo, LabeledData | None]:
    """The task and the test set, taken from ``dataset.*`` exactly as ``alma simulate`` takes them."""
    if config.dataset.name == "arrays":
        from alma_daemon.data.arrays import arrays_task, load_npz

        test = load_npz(config.dataset.test_file) if config.dataset.test_file else None
        return arrays_task(config.dataset), test
    from alma_daemon.simulate import simulated_stream

    stream = simulated_stream(config)
    return stream.task, stream.test


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


# -- the daemon -----------------------------------------------------------------------------------
class Daemon:
    """Ingest beside the engine, periodic jobs, clean stop, exact resume."""

    def __init__(self, config: Config, client: Any, *, until_chunks: int | None = None,
                 observers: list[EngineObserver] | tuple[EngineObserver, ...] = ()):
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
        self._in_step = False
        self._phase = "starting"

    # -- start-up ---------------------------------------------------------------------------------
    def restore(self) -> Engine:
        """The engine as the last committed step left it (a fresh one on first start)."""
        config = self.config
        task, test = stream_task(config)
        self.schema = stream_schema(task)
        if task.kind == "language_model":
            self.ready = ReadyChunks(self.client, self.keys, seq_len=task.input_shape[0])
        state = self.state_store.load()
        version = state.model_version if state is not None else 0
        store = CheckpointStore(config.daemon.checkpoint_dir, config.serving.model_name)
        self._drop_uncommitted_checkpoints(store, version)
        device = resolve_device(config.device)
        if version:
            if version not in store.versions():
                raise RuntimeError(f"the engine state in Redis ({self.keys.engine}) is at model version {version}, "
                                   f"but {store.folder} holds no complete version {version}")
            learner = store.load(version, str(device))
        else:
            learner = build_learner(config.learner.name, task, config.learner, config.seed)
        policy = build_policy(config.policy)
        policy_state = load_json(self.client, self.keys.policy)
        if policy_state is not None:
            policy.load_state_dict(policy_state)
        self.buffer = RedisBuffer(self.client, self.keys)
        self.engine = Engine(learner, policy, self.buffer, config, device, test_set=test, checkpoints=store,
                             observers=[*daemon_observers(config), self.metrics, self.checkpoint_clock,
                                        *self.extra_observers], state=state)
        self.metrics.sync(self.engine)
        log.info("engine restored", extra={"chunks_seen": self.engine.state.chunks_seen, "model_version": version,
                                           "pending": len(self.buffer.pending_chunks())})
        return self.engine

    @staticmethod
    def _drop_uncommitted_checkpoints(store: CheckpointStore, version: int) -> None:
        newer = [v for v in store.versions() if v > version]
        if not newer:
            return
        if newer != [version + 1]:
            raise RuntimeError(f"{store.folder} holds versions {newer} newer than the committed model version "
                               f"{version}: they belong to another run; use another daemon.checkpoint_dir")
        # Written by a stage whose step was never committed; the redone step writes it again.
        log.warning("removing checkpoint of an uncommitted stage", extra={"version": newer[0]})
        shutil.rmtree(store.path(newer[0]))

    # -- the main loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (signal, :meth:`request_stop`) or ``until_chunks`` chunks are processed."""
        engine = self.engine or self.restore()
        assert self.schema is not None
        self.ingest = IngestWorker(build_source(self.config, self.client), self.client, self.keys, self.schema,
                                   max_buffer_bytes=self.config.redis.max_buffer_bytes, on_chunk_ready=self.wake.set)
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
            while not self.stop_requested.is_set() and not self._target_reached(engine):
                self._check_ingest()
                chunk_id = self.ready.first()
                if chunk_id is not None:
                    self._step(lambda: self._process_chunk(chunk_id))
                elif self.policy_check_due.is_set():
                    self.policy_check_due.clear()
                    self._step(self._policy_tick)
                else:
                    self.wake.wait(self.config.daemon.poll_seconds)
                    self.wake.clear()
            if self.publisher is not None and not self.stop_requested.is_set():
                # A scripted run (--until-chunks) ends with its last version published; a stop on a
                # signal does not wait: the next start catches up on unpublished versions.
                self.publisher.wait_idle(PUBLISH_DRAIN_SECONDS)
        finally:
            if self.exporter is not None:
                self.exporter.stop()
            self._set_phase("stopping")
            scheduler.shutdown(wait=False)
            self.ingest.stop()
            if self.publisher is not None:
                self.publisher.close()
            self._restore_signal_handlers(previous)
            self._set_phase("stopped")
            self.write_status()

    def _target_reached(self, engine: Engine) -> bool:
        return self.until_chunks is not None and engine.state.chunks_seen >= self.until_chunks

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
            self._discard(chunk_id, RejectedRecord(
                "chunk_order", f"chunk {chunk_id} is ready but the engine already processed chunk {engine.state.last_chunk}"))
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
        pipe = self.client.pipeline(transaction=True)
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
        pipe = self.client.pipeline(transaction=True)
        self.ready.stage_consume(pipe, chunk_id)
        dead_letter(pipe, self.keys, rejection.reason, rejection.detail, f"chunk {chunk_id}")
        pipe.execute()
        telemetry.RECORDS_REJECTED.labels(rejection.reason).inc()
        log.warning("ready chunk rejected", extra={"chunk": chunk_id, "reason": rejection.reason,
                                                   "detail": rejection.detail})

    # -- periodic jobs (called from the scheduler's thread) ---------------------------------------
    def request_policy_check(self) -> None:
        """Ask the main loop to let the policy decide between chunks (time-based policies)."""
        self.policy_check_due.set()
        self.wake.set()

    def write_status(self) -> None:
        """Heartbeat and phase in ``alma:{s}:daemon`` (read by ``alma status``), and buffer gauges."""
        self.client.hset(self.keys.daemon, mapping={
            "pid": os.getpid(), "phase": self._phase, "heartbeat": f"{time.time():.3f}",
            "rss_bytes": psutil.Process().memory_info().rss, "healthy": int(self.healthy),
            "ingest": self._ingest_state(),
        })
        self._update_gauges()

    def _ingest_state(self) -> str:
        if self.ingest is None or not self.ingest.alive:
            return "stopped"
        return "paused" if self.ingest.paused else "running"

    def check_health(self) -> None:
        """Healthy while Redis answers and the ingest thread runs."""
        try:
            redis_ok = bool(self.client.ping())
        except Exception:  # noqa: BLE001 - any failure to reach Redis means unhealthy
            redis_ok = False
        ingest_ok = self.ingest is not None and self.ingest.alive
        if self.healthy != (redis_ok and ingest_ok):
            log.warning("health changed", extra={"redis": redis_ok, "ingest": ingest_ok})
        self.healthy = redis_ok and ingest_ok
        if self.exporter is not None:
            self.exporter.set_ready(self.healthy)

    def _update_gauges(self) -> None:
        buffered = self.ready.count()
        if self.buffer is not None:
            buffered += len(self.buffer.pending_chunks()) + len(self.buffer.kept_chunks())
        telemetry.BUFFER_CHUNKS.set(buffered)

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        self.client.hset(self.keys.daemon, mapping={"phase": phase, "phase_since": f"{time.time():.3f}"})

    # -- signals ----------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop_requested.set()
        self.wake.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_requested.is_set() and self._in_step:
            raise StepAbandoned(f"signal {signal.Signals(signum).name}: current step abandoned, redone on restart")
        log.warning("stopping after the current step (signal again to abandon it)",
                    extra={"signal": signal.Signals(signum).name})
        self.request_stop()

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
