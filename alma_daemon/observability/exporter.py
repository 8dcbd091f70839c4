"""The Prometheus exporter: an HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``, and the
engine observer that feeds the engine's measures into :mod:`alma_daemon.metrics`.

The daemon (``alma run``) and ``alma simulate --metrics-port P`` start it the same way::

    exporter = start_exporter(config.metrics.port, config.metrics.host)
    observer = MetricsObserver()         # in_process_source=True for ``alma simulate``
    observer.sync(engine)                # once, after resuming an engine from its saved state
    exporter.set_ready(True)             # once the engine takes chunks
    ...
    exporter.stop()
"""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Gauge, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from alma_daemon import metrics
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StageRecord, StepRecord
from alma_daemon.infra.unreachable import ServerUnreachable
from policies import Decision

log = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    # A scrape a second would otherwise write an access-log line a second to stderr.
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Exporter:
    """A running exporter (see :func:`start_exporter`); serves from a daemon thread until :meth:`stop`.

    - ``/metrics``: the registry in the Prometheus text format (OpenMetrics when asked for, gzip
      when accepted);
    - ``/healthz``: 200 while the process serves HTTP (liveness);
    - ``/readyz``: 200 once :meth:`set_ready` was given True, 503 before and after False (readiness).
    """

    def __init__(self, host: str, port: int, registry: Collector):
        self._ready = threading.Event()
        self._metrics = make_wsgi_app(registry)
        server_class = _server_class(host)
        self._server = make_server(host, port, self._app, server_class, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="alma-exporter", daemon=True)
        self._thread.start()
        log.info("metrics exporter listening", extra={"host": host, "port": self.port})

    @property
    def port(self) -> int:
        """The port actually bound (the one asked for, or the kernel's pick for 0)."""
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        assert isinstance(host, str)  # an IP socket's address (bytes only for AF_UNIX)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def set_ready(self, ready: bool) -> None:
        """What ``/readyz`` answers: True once the service takes work, False while it cannot."""
        if ready:
            self._ready.set()
        else:
            self._ready.clear()

    def stop(self) -> None:
        """Stop serving and free the port; safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            status, body = "200 OK", b"ok\n"
        elif path == "/readyz":
            status, body = ("200 OK", b"ready\n") if self.ready else ("503 Service Unavailable", b"not ready\n")
        else:
            status, body = "404 Not Found", b"not found: try /metrics, /healthz or /readyz\n"
        # A new header list per response: wsgiref appends Content-Length to the list it is given.
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body]


def _server_class(host: str) -> type[ThreadingWSGIServer]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server


def start_exporter(port: int, host: str = "127.0.0.1", registry: Collector = metrics.REGISTRY) -> Exporter:
    """Serve ``registry`` on ``host:port`` (0 = any free port) from a background thread.

    Raises :class:`~alma_daemon.infra.unreachable.ServerUnreachable`, naming ``metrics.port``, when
    the port is taken. Callers skip this when ``metrics.port`` is 0 (off).
    """
    try:
        return Exporter(host, port, registry)
    except OSError as exc:
        raise ServerUnreachable("metrics", f"{host}:{port}", exc) from exc


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _set_policy_estimates(estimates: dict[str, float]) -> None:
    """Every estimate gauge from one decision: one it does not carry is NaN, not a stale earlier value
    (so a restarted daemon exports what an uninterrupted one does)."""
    for name, gauge in metrics.POLICY_ESTIMATES.items():
        gauge.set(estimates.get(name, math.nan))


class MetricsObserver(EngineObserver):
    """Feeds the engine's decisions, training stages and per-chunk records into the metrics.

    ``in_process_source=True`` (``alma simulate``): chunks come from inside the process, where no
    ingest or buffer component counts them, so this observer also updates the chunk and example
    counters and the buffer gauge. The daemon leaves it False: its ingest and buffer do that.
    """

    def __init__(self, in_process_source: bool = False):
        self.in_process_source = in_process_source
        self._examples_seen = 0
        #: The stream's training FLOPs this observer has added to ``alma_train_flops_total``.
        self._flops_counted = 0

    def sync(self, engine: Engine) -> None:
        """Show a resumed (or reloaded) engine's state at once, before its next chunk.

        Brings ``alma_train_flops_total`` up to the engine's saved total, so it stays the stream's
        cumulative FLOPs across restarts and reloads, and sets the gauges from the saved state instead
        of leaving them at 0 (or NaN) until the next chunk arrives.
        """
        state = engine.state
        self._count_flops_up_to(state.cumulative_train_flops)
        if state.series:
            self.show(StepRecord.from_row(state.series[-1]))
        # Stages started between chunks (time-based policies) are newer than the last record.
        metrics.MODEL_VERSION.set(state.model_version)
        metrics.PARAMETERS.set(engine.learner.num_parameters())
        _set_policy_estimates(state.last_decision.get("estimates", {}))
        _show_freshness(engine)
        self._examples_seen = state.examples_seen

    def _count_flops_up_to(self, total: int) -> None:
        """Raise the counter to the stream's ``total``. A step redone after a reload from Redis (an
        outage, a restart beneath it) reaches a total already counted, and adds nothing again."""
        if total > self._flops_counted:
            metrics.TRAIN_FLOPS.inc(total - self._flops_counted)
            self._flops_counted = total

    def on_decision(self, decision: Decision, engine: Engine) -> None:
        metrics.POLICY_DECISIONS.labels(decision.action).inc()
        _set_policy_estimates(decision.estimates)

    def on_stage(self, stage: StageRecord, engine: Engine) -> None:
        metrics.MODEL_UPDATES.labels(stage.kind).inc()
        if stage.restarted:
            metrics.RESERVOIR_RESTARTS.inc()
        # The engine adds the stage to its total after its observers have seen it.
        self._count_flops_up_to(engine.state.cumulative_train_flops + stage.train_flops)
        metrics.TRAIN_DURATION.observe(stage.train_seconds)
        # A new version exists as soon as the stage ends, before the test evaluation of on_step.
        metrics.MODEL_VERSION.set(stage.model_version)
        metrics.PARAMETERS.set(stage.parameters)
        # A stage between chunks (on_tick) makes the model new without a step record.
        _show_freshness(engine)

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        if self.in_process_source:
            metrics.CHUNKS_RECEIVED.inc()
            metrics.EXAMPLES_RECEIVED.inc(record.examples_seen - self._examples_seen)
            metrics.BUFFER_CHUNKS.set(len(engine.buffer.pending_chunks()))
        self._examples_seen = record.examples_seen
        if record.late:
            metrics.LATE_CHUNKS.inc()
        self.show(record)
        _show_freshness(engine)

    @staticmethod
    def show(record: StepRecord) -> None:
        """Set the gauges from a step's record."""
        # The paper's families carry their own measure only: the error rate for classifiers judged by it,
        # perplexity for language models; the other family holds NaN (no measurement).
        is_error = record.measure == "error"
        for name in metrics.ERROR_SETS:
            metrics.ERROR_RATIO.labels(name).set(_or_nan(record.measured("error", on=name)))
            metrics.PERPLEXITY.labels(name).set(_or_nan(record.measured("perplexity", on=name)))
        metrics.CUMULATIVE_ERROR.set(_or_nan(record.cumulative if is_error else None))
        metrics.CUMULATIVE_PREQUENTIAL_ERROR.set(_or_nan(record.cumulative_prequential if is_error else None))
        _show_measure(record)
        metrics.PARAMETERS.set(record.parameters)
        metrics.CUMULATIVE_PARAMETERS.set(record.cumulative_parameters)
        metrics.MODEL_VERSION.set(record.model_version)
        metrics.MODEL_AGE_CHUNKS.set(_or_nan(record.model_age_chunks))


def _show_freshness(engine: Engine) -> None:
    """The model's age and the freshness bound, from the engine: its age in chunks, the time its age in
    seconds counts from (``time() - alma_last_stage_timestamp_seconds``), and ``policy.max_model_age_*``."""
    chunks, _ = engine.model_age()
    state, policy = engine.state, engine.config.policy
    metrics.MODEL_AGE_CHUNKS.set(chunks)
    metrics.LAST_STAGE_TIMESTAMP.set(state.last_stage_at if state.last_stage_at is not None else state.started_at)
    metrics.FRESHNESS_BOUND_CHUNKS.set(_or_nan(policy.max_model_age_chunks))
    metrics.FRESHNESS_BOUND_EXAMPLES.set(_or_nan(policy.max_model_age_examples))
    metrics.FRESHNESS_BOUND_SECONDS.set(_or_nan(policy.max_model_age_seconds))


def _show_measure(record: StepRecord) -> None:
    """The task's measure's families: the record's measure and details, each set's (NaN where not taken)."""
    m = record.measure
    _show_only(metrics.TASK_MEASURE, {(m, on): _or_nan(record.measured(m, on=on)) for on in metrics.ERROR_SETS})
    _show_only(
        metrics.CUMULATIVE_MEASURE,
        {(m, "test"): _or_nan(record.cumulative), (m, "prequential"): record.cumulative_prequential},
    )
    _show_only(metrics.BASELINE_MEASURE, {(m,): _or_nan(record.baseline)})
    _show_only(metrics.PREQUENTIAL_WINDOW_MEASURE, {(m,): _or_nan(record.prequential_window)})
    _show_only(metrics.REFERENCE_PREQUENTIAL_MEASURE, {(m,): _or_nan(record.reference)})
    _show_only(metrics.REFERENCE_PREQUENTIAL_WINDOW_MEASURE, {(m,): _or_nan(record.reference_window)})
    details = {"test": record.test_measures or {}, "prequential": record.prequential_measures or {}}
    names = dict.fromkeys([*details["test"], *details["prequential"]])
    _show_only(
        metrics.MEASURE_DETAIL,
        {(name, on): _or_nan(details[on].get(name)) for name in names for on in metrics.ERROR_SETS},
    )


def _show_only(gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
    """Set ``gauge``'s series of ``values`` (label values -> value) and remove its others: those of an
    earlier stream's measure or details, which would otherwise stay at their last value."""
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    for family in gauge.collect():
        for sample in family.samples:
            labels = tuple(sample.labels.values())
            if labels not in values:
                gauge.remove(*labels)
