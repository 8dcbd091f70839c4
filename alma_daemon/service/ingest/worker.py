"""The ingest loop: source -> validate (wire.py) -> assemble -> one Redis transaction per poll.

It runs in its own thread beside the engine, so a long training stage never stalls consumption;
the two meet only in Redis (complete chunks in ``alma:{s}:ready``). A second thread runs the
transactions, in order, while the next poll is read. Memory stays bounded: at most
``MAX_IN_FLIGHT + 1`` polls of records are held, polling pauses while more than
``max_buffer_bytes`` of complete chunks wait for the engine, and the assembler bounds the parts of
incomplete chunks. A chunk still incomplete ``incomplete_chunk_seconds`` after its first part arrived
is given up (dead-lettered as ``incomplete``, its parts deleted) in a batch's transaction, once
ingest has caught up with the transport: its missing parts are not waiting unread behind a backlog.

Outages (docs/service.md, "Outages"): while Redis is unreachable the thread waits with backoff and
then resyncs from what Redis holds; while the transport is, kafka-python reconnects on its own and
the periodic lag query, which then fails, reports the outage. Both go on the daemon's
:class:`~alma_daemon.infra.outages.OutageBoard`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from alma_daemon import metrics
from alma_daemon.config import Config
from alma_daemon.data.wire import RejectedRecord, StreamSchema, decode_record
from alma_daemon.data.wire_format import DEFAULT_MAX_CHUNKS_AHEAD
from alma_daemon.infra.outages import REDIS_UNREACHABLE, OutageBoard, one_line, retry_delays
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.infra.unreachable import outage_line
from alma_daemon.logs import NOTICE
from alma_daemon.runtime import run_beside_training
from alma_daemon.service.ingest.cutter import EventCollector, EventStream
from alma_daemon.service.ingest.store import IngestBatch, IngestStore
from alma_daemon.transports.source import RecordSource, SourceRecord

log = logging.getLogger(__name__)

#: Records per poll (and per transaction): about 14 MiB of parts at most.
POLL_RECORDS = 16
#: Event records per poll: events are small (one example or a few), and a transaction per 16 of them
#: would bound ingest at a few hundred examples a second.
POLL_EVENTS = 512
#: Transactions queued for the committer thread while the next batch is read (memory: one batch each).
MAX_IN_FLIGHT = 2
#: Seconds between refreshes of the ingest-lag gauge (each asks the transport).
LAG_REFRESH_SECONDS = 2.0


@dataclass(frozen=True)
class IngestLimits:
    """What ingest holds at most: complete chunks waiting for the engine (``redis.max_buffer_bytes``;
    polling pauses above it), chunk ids ahead of the oldest in progress (``daemon.max_chunks_ahead``),
    and how long a chunk may stay incomplete (``daemon.incomplete_chunk_seconds``; None: for ever)."""

    max_buffer_bytes: int
    max_chunks_ahead: int = DEFAULT_MAX_CHUNKS_AHEAD
    incomplete_chunk_seconds: float | None = None

    @classmethod
    def from_config(cls, config: Config) -> IngestLimits:
        return cls(
            config.redis.max_buffer_bytes, config.daemon.max_chunks_ahead, config.daemon.incomplete_chunk_seconds
        )


@dataclass(frozen=True)
class IngestClock:
    """Time as ingest reads it: ``now`` stamps the chunks' arrival and ages them; ``lag_refresh_seconds``
    spaces the lag queries."""

    now: Callable[[], float] = time.time
    lag_refresh_seconds: float = LAG_REFRESH_SECONDS


class CommitSkipped(RuntimeError):
    """A batch not written because an earlier batch's transaction failed; it is read again after resync."""


class IngestWorker:
    """Moves records of one stream from a :class:`RecordSource` into the Redis buffer, exactly once."""

    def __init__(
        self,
        source: RecordSource,
        client: Any,
        keys: StreamKeys,
        schema: StreamSchema,
        limits: IngestLimits,
        *,
        events: EventStream | None = None,
        on_chunk_ready: Callable[[], None] = lambda: None,
        outages: OutageBoard | None = None,
        clock: IngestClock | None = None,
    ):
        """``events``: the stream's records are labeled events, cut into chunks (None: chunk parts)."""
        self.source = source
        #: Where this thread reports Redis and transport outages (the daemon's board).
        self.outages = outages or OutageBoard(limit_seconds=float("inf"))
        self._delays = retry_delays()
        self.store = IngestStore(client, keys)
        self.keys = keys
        self.schema = schema
        self.limits = limits
        clock = clock or IngestClock()
        self.clock = clock.now
        self.lag_refresh_seconds = clock.lag_refresh_seconds
        #: Records the transport held unread at the last lag query; None while unknown (the transport down).
        self.last_lag: int | None = None
        self.on_chunk_ready = on_chunk_ready
        #: Event streams (``stream.chunk_examples``/``chunk_seconds``): records are events, cut into chunks.
        self.events = events
        self.poll_records = POLL_RECORDS if events is None else POLL_EVENTS
        self._load_progress()
        self.source.seek(self.store.offsets())
        self.paused = False
        self._queued_bound = self.store.recount_queued_bytes()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The first lag query waits one period: at start-up the gauge matters less than the first poll.
        self._next_lag = time.monotonic() + self.lag_refresh_seconds
        # A single committer thread runs the transactions one at a time, in submission order.
        self._committer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"ingest-commit-{keys.stream}", initializer=run_beside_training
        )
        #: The commits submitted and not yet waited for, oldest first.
        self._in_flight: deque[Future[Any]] = deque()
        self._commit_failed = False

    # -- one step ---------------------------------------------------------------------------------
    def step(self, timeout: float = 0.5) -> int:
        """Poll once, validate and assemble, and hand the batch to the committer; returns records handled.

        Earlier batches' transactions run while this one is read (Redis and Kafka work in parallel);
        batches still commit one at a time and in order, each with its own offsets.
        """
        if self._over_limit():
            self._refresh_lag()  # a transport outage during a pause is reported too
            self._stop.wait(min(timeout, 0.2))
            return 0
        records = self.source.poll(timeout, self.poll_records)
        if records and self.outages.is_down(self.source.server):
            # Records prove the transport is back before the next lag query does (every few seconds).
            self._transport_answered()
        batch = self._assemble_batch(records) if self.collector is None else self.collector.collect(records)
        while len(self._in_flight) >= MAX_IN_FLIGHT or (self._in_flight and self._in_flight[0].done()):
            self._in_flight.popleft().result()
        self._queued_bound += sum(progress.bytes for progress in batch.completed.values())
        if batch:
            self._in_flight.append(self._committer.submit(self._commit, batch))
        self._refresh_lag()
        return len(records)

    def _transport_answered(self) -> None:
        """The transport answered (a lag query, or a poll that returned records): an outage of it ended."""
        ended = self.outages.up(self.source.server)
        if ended is not None:
            log.log(
                NOTICE,
                f"{ended.describe()} answers again: ingest goes on",
                extra={"server": self.source.server, "outage_seconds": round(time.time() - ended.since, 1)},
            )

    def _load_progress(self) -> None:
        """The chunks in progress as Redis holds them: the assembler's, or an event stream's open chunk."""
        limits = self.limits
        self.assembler = self.store.load_assembler(
            limits.max_buffer_bytes, limits.max_chunks_ahead, limits.incomplete_chunk_seconds, self.clock
        )
        self.collector: EventCollector | None = None
        if self.events is not None:
            self.collector = self.events.collector(self.schema, self.store.open_chunk_fields())

    def _assemble_batch(self, records: list[SourceRecord]) -> IngestBatch:
        """Validate ``records`` and account for their parts: the batch that stores them, and gives up
        the chunks incomplete for too long."""
        batch = IngestBatch(at=self.clock())
        refused = set(self.assembler.refused)
        for record in records:
            batch.offsets[record.position] = record.next_offset
            try:
                if record.problem is not None:
                    raise RejectedRecord("headers", record.problem)
                part = decode_record(record.key, record.value, record.headers, self.schema, self.keys.stream)
                outcome = self.assembler.accept(part, len(record.value or b""))
            except RejectedRecord as rejection:
                batch.rejected.append((record, rejection))
                continue
            for chunk_id, (progress, why) in outcome.dropped.items():
                batch.abandon(chunk_id, progress, why)
            if outcome.store:
                batch.parts.append((part, record))
            if outcome.completed is not None:
                batch.completed[part.chunk_id] = outcome.completed
        if self.caught_up:
            for chunk_id, (progress, why) in self.assembler.expire().items():
                batch.abandon(chunk_id, progress, why)
        if self.assembler.refused != refused:
            batch.refused = set(self.assembler.refused)
        if batch.completed:
            batch.newest_completed = self.assembler.last_completed
            batch.window_floor = self.assembler.window_floor
        return batch

    def _commit(self, batch: IngestBatch) -> None:
        # A batch was assembled assuming every earlier one committed; after a failure it must not run.
        if self._commit_failed:
            raise CommitSkipped("an earlier ingest transaction failed; this batch is read again after resync")
        try:
            self.store.commit(batch)
        except BaseException:
            self._commit_failed = True
            raise
        self._report(batch)  # before a failing acknowledge could skip it: the batch is in Redis
        self.source.acknowledge(batch.offsets)

    @property
    def caught_up(self) -> bool:
        """Whether the last lag query found every record of the transport read (and, on a Redis stream,
        committed): a chunk still incomplete then is one whose parts were not sent, not parts waiting
        unread behind a backlog (the daemon was stopped, or ingest paused)."""
        return self.last_lag == 0

    def flush(self) -> None:
        """Wait until every submitted batch is committed; re-raises the first error (then call :meth:`resync`)."""
        while self._in_flight:
            self._in_flight.popleft().result()

    def _over_limit(self) -> bool:
        # Only complete chunks count: the engine drains them, so a pause always ends. The engine only
        # ever lowers the queued total, so last read + bytes of the chunks completed since is an
        # upper bound: Redis is asked only when that bound crosses the limit, once the batches
        # submitted are committed (else their chunks would be missed, and each uncounted batch could
        # take the total one more poll past the limit).
        if self._queued_bound > self.limits.max_buffer_bytes:
            self.flush()
            self._queued_bound = self.store.queued_bytes()
        over = self._queued_bound > self.limits.max_buffer_bytes
        if over != self.paused:
            self.paused = over
            # Backpressure, not a fault: a producer ahead of training pauses ingest again and again.
            log.info(
                "ingest paused: buffer full" if over else "ingest resumed",
                extra={"stream": self.keys.stream, "max_buffer_bytes": self.limits.max_buffer_bytes},
            )
        return over

    def _report(self, batch: IngestBatch) -> None:
        for record, rejection in batch.rejected:
            metrics.RECORDS_REJECTED.labels(rejection.reason).inc()
            log.warning(
                "record rejected",
                extra={"reason": rejection.reason, "origin": record.origin, "detail": rejection.detail[:300]},
            )
        for chunk_id, _, why in batch.abandoned:
            metrics.RECORDS_REJECTED.labels(why.reason).inc()
            log.warning(
                "incomplete chunk abandoned",
                extra={"chunk": chunk_id, "reason": why.reason, "detail": why.detail[:300]},
            )
        for chunk_id, progress in batch.completed.items():
            metrics.CHUNKS_RECEIVED.inc()
            metrics.EXAMPLES_RECEIVED.inc(progress.examples)
            log.info(
                "chunk received", extra={"chunk": chunk_id, "examples": progress.examples, "parts": progress.parts}
            )
        if batch.completed:
            self.on_chunk_ready()

    def _refresh_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag:
            return
        self._next_lag = now + self.lag_refresh_seconds
        # The lag query is also the transport's health probe: a Kafka consumer's poll returns nothing,
        # without an error, while the broker is down (kafka-python reconnects on its own).
        server = self.source.server
        self.last_lag = None  # unknown until the transport answers
        try:
            lag = self.source.lag()
        except self.source.unreachable as exc:
            if not self.outages.is_down(server):
                address = self.outages.addresses.get(server, "")
                log.warning(
                    outage_line(server, address, exc, self.outages.limit_seconds),
                    extra={"server": server, "error": one_line(exc)},
                )
            self.outages.down(server, exc)
            return
        self.last_lag = lag
        self._transport_answered()
        if lag is not None:
            metrics.INGEST_LAG.set(lag)

    def resync(self) -> None:
        """After a failed Redis call: forget in-memory progress and continue from what Redis holds.

        The transactions still in flight are waited for, and their failures logged: the error that
        led here may have come from a poll or the pause's count, and a failed transaction left in
        the queue was reported nowhere else.
        """
        for future in self._in_flight:
            error = future.exception()
            if error is not None and not isinstance(error, CommitSkipped):
                log.warning(
                    "ingest: a transaction failed; continuing from what Redis holds",
                    extra={"stream": self.keys.stream, "error": one_line(error)},
                )
        self._in_flight.clear()
        self._commit_failed = False
        self.last_lag = None  # the source goes back to the stored offsets: caught up no longer
        self.store.follow_server()
        self._queued_bound = self.store.queued_bytes()
        self._load_progress()
        self.source.seek(self.store.offsets())

    # -- the thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"ingest-{self.keys.stream}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        run_beside_training()
        failures = 0
        while not self._stop.is_set():
            try:
                if failures:
                    self.resync()  # a transaction may have been cut: continue from what Redis holds
                    self.outages.up("redis")
                    failures = 0
                self.step()
            except REDIS_UNREACHABLE as exc:
                if not failures:
                    # The main loop, which meets the outage too, warns of it with what it waits for.
                    log.info("ingest: Redis unreachable, retrying", extra={"error": one_line(exc)})
                self.outages.down("redis", exc)
                self._stop.wait(self._delays.compute(failures))
                failures += 1
            except BaseException as exc:
                self.error = exc
                log.error("ingest stopped by an error", exc_info=True)
                return

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread, wait for the submitted batches and close the source.

        A thread still running after ``timeout`` (a Redis call may block for 30 s) still uses the
        source and the queue of submitted batches: both are left to it, with a warning, rather than
        closed or drained under it.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "ingest: the thread did not stop in time; its source is left open",
                    extra={"stream": self.keys.stream, "timeout_seconds": timeout},
                )
                return
        try:
            self.flush()
        finally:
            self._committer.shutdown(wait=True)
            self.source.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
