"""The Prometheus metrics of alma-daemon (listed in docs/observability.md), in one registry.

Every part of the service (ingest, buffer, engine, publisher) updates these objects; the exporter
(``/metrics``, :mod:`alma_daemon.observability.exporter`) renders :data:`REGISTRY`. Base units, ``_total`` for
counters (prometheus_client appends it), and only small fixed label sets: no ids or offsets as
label values.

Every labelled series is created at import with each of its known label values, so a dashboard's
``rate()`` and ``sum by`` queries return data (zeros) before the first event, and "nothing was
rejected" is visible as a 0 instead of as a missing series. The families labelled by the task's
measure are the exception: which measure, and which details, is known from the stream's first chunk. Gauges with no measurement yet hold
NaN, which Prometheus stores and Grafana draws as a gap, rather than a misleading 0.

Counters count since the process started, as usual, except ``alma_train_flops_total``: it counts
the whole stream (Eq. 2's cumulative FLOPs), because a restarted daemon's
:meth:`alma_daemon.observability.exporter.MetricsObserver.sync` starts it from the engine's saved total, which
Prometheus sees as an ordinary increase, not a reset.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from alma_daemon.data.wire_format import REJECT_REASONS

# The *_created series double every counter and histogram and no dashboard uses them.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)

#: Label values: ``alma_error_ratio{set}``, ``alma_perplexity{set}`` and the task's measure's ``{set}``.
ERROR_SETS: tuple[str, ...] = ("test", "prequential")
#: ``alma_model_updates_total{kind}``: the engine's training-stage kinds.
UPDATE_KINDS: tuple[str, ...] = ("finetune", "grow", "scratch", "linear")
#: ``alma_policy_decisions_total{action}``: :attr:`policies.Decision.action`.
DECISION_ACTIONS: tuple[str, ...] = ("wait", "train", "grow+train")
#: ``alma_server_up{server}``: the servers the daemon depends on (alma_daemon/infra/outages.py).
SERVERS: tuple[str, ...] = ("redis", "kafka")
#: ``alma_swap_failures_total{stage}``: the publishing steps of docs/serving.md.
SWAP_STAGES: tuple[str, ...] = ("archive", "guard", "register", "probe", "set_default", "drain", "delete")

# -- ingest and buffer --------------------------------------------------------------------------
CHUNKS_RECEIVED = Counter("alma_chunks_received", "Complete chunks received", registry=REGISTRY)
EXAMPLES_RECEIVED = Counter("alma_examples_received", "Examples received in complete chunks", registry=REGISTRY)
RECORDS_REJECTED = Counter(
    "alma_records_rejected", "Records sent to the dead-letter stream, by reason", ["reason"], registry=REGISTRY
)
BUFFER_CHUNKS = Gauge("alma_buffer_chunks", "Chunks held in the buffer", registry=REGISTRY)
CHUNKS_WAITING_ON_GAP = Gauge(
    "alma_chunks_waiting_on_gap", "Ready chunks held back while a lower chunk id is missing", registry=REGISTRY
)
LATE_CHUNKS = Counter(
    "alma_late_chunks", "Chunks taken after a later chunk (they completed late), trained as a step", registry=REGISTRY
)
INGEST_LAG = Gauge("alma_ingest_lag_records", "Records on the topic not yet ingested", registry=REGISTRY)
KAFKA_OFFSET_RESETS = Counter(
    "alma_kafka_offset_resets",
    "Kafka partitions moved because the broker no longer held their position (offset out of range, log truncated)",
    registry=REGISTRY,
)

# -- anytime error (Eq. 1) ----------------------------------------------------------------------
ERROR_RATIO = Gauge(
    "alma_error_ratio",
    "Error rate of the live model: on the test set after the latest chunk (test), "
    "or on the latest chunk before training on it (prequential)",
    ["set"],
    registry=REGISTRY,
)
CUMULATIVE_ERROR = Gauge(
    "alma_cumulative_error", "CER so far: sum of test error rates over chunks (Eq. 1)", registry=REGISTRY
)
CUMULATIVE_PREQUENTIAL_ERROR = Gauge(
    "alma_cumulative_prequential_error", "Sum of prequential error rates over chunks", registry=REGISTRY
)
PERPLEXITY = Gauge(
    "alma_perplexity", "Language-model streams: perplexity, sets as for alma_error_ratio", ["set"], registry=REGISTRY
)

# -- the task's measure (task.measure, docs/measures.md): any measure, the error rate's too -----------
# Labelled by the measure's name; they hold the series of the stream's measure from its first chunk on
# (or from a resumed daemon's sync), and no others.
TASK_MEASURE = Gauge(
    "alma_task_measure",
    "The task's measure (label measure) of the live model, sets as for alma_error_ratio",
    ["measure", "set"],
    registry=REGISTRY,
)
CUMULATIVE_MEASURE = Gauge(
    "alma_cumulative_measure",
    "Sum over chunks of the task's measure: on the test set (test; the CER of the error rate; none for a "
    "perplexity) or on each chunk before training on it (prequential)",
    ["measure", "set"],
    registry=REGISTRY,
)
BASELINE_MEASURE = Gauge(
    "alma_baseline_measure",
    "The task's measure of an input-blind model (majority class, mean target) on the test set, else on the "
    "latest chunk: what the model must beat; NaN where not recorded (the paper's tasks)",
    ["measure"],
    registry=REGISTRY,
)
MEASURE_DETAIL = Gauge(
    "alma_measure_detail",
    "The task's other measures (binary: error, recall, precision, pr_auc; multi-class: recall[<class>]), "
    "sets as for alma_error_ratio",
    ["measure", "set"],
    registry=REGISTRY,
)

# -- the reference learner (reference.kind): a linear model learnt on the same stream, beside the network
REFERENCE_PREQUENTIAL_MEASURE = Gauge(
    "alma_reference_prequential_measure",
    "The task's measure (label measure) of the reference learner, a linear model learnt on the same stream, on "
    'the latest chunk before learning it (as alma_task_measure{set="prequential"}); NaN without a reference',
    ["measure"],
    registry=REGISTRY,
)
REFERENCE_PREQUENTIAL_WINDOW_MEASURE = Gauge(
    "alma_reference_prequential_window_measure",
    "The reference learner's measure over the last stream.prequential_window chunks (as "
    "alma_prequential_window_measure): a network no better is behind a linear model; NaN without a reference",
    ["measure"],
    registry=REGISTRY,
)

# -- freshness: what users of an endless stream saw lately, and how old the model is ----------------
PREQUENTIAL_WINDOW_MEASURE = Gauge(
    "alma_prequential_window_measure",
    "The task's measure (label measure) over the last stream.prequential_window chunks, each taken before "
    "training on it (their mean): the measure users saw lately",
    ["measure"],
    registry=REGISTRY,
)
MODEL_AGE_CHUNKS = Gauge(
    "alma_model_age_chunks",
    "Chunks arrived since the last training stage (since the stream's start before the first)",
    registry=REGISTRY,
)
# The time of the stage, not the seconds since: time() - alma_last_stage_timestamp_seconds keeps rising
# between chunks and scrapes, and cannot freeze when the process does (Prometheus's instrumentation practice).
LAST_STAGE_TIMESTAMP = Gauge(
    "alma_last_stage_timestamp_seconds",
    "Unix time the last training stage ended (the stream's start before the first): the model's age in "
    "seconds is time() minus it",
    registry=REGISTRY,
)
FRESHNESS_BOUND_CHUNKS = Gauge(
    "alma_freshness_bound_chunks",
    "policy.max_model_age_chunks: a stage is forced once the model is this many chunks old; NaN when unset",
    registry=REGISTRY,
)
FRESHNESS_BOUND_EXAMPLES = Gauge(
    "alma_freshness_bound_examples",
    "policy.max_model_age_examples: a stage is forced once this many examples arrived since the last; NaN when unset",
    registry=REGISTRY,
)
FRESHNESS_BOUND_SECONDS = Gauge(
    "alma_freshness_bound_seconds",
    "policy.max_model_age_seconds: a stage is forced once the model is this old and a chunk waits; NaN when unset",
    registry=REGISTRY,
)

# -- compute (Eq. 2) ----------------------------------------------------------------------------
TRAIN_FLOPS = Counter("alma_train_flops", "Training FLOPs spent on the stream (forward + backward)", registry=REGISTRY)
PARAMETERS = Gauge("alma_parameters", "Parameters of the current model", registry=REGISTRY)
CUMULATIVE_PARAMETERS = Gauge(
    "alma_cumulative_parameters", "Sum over chunks of the model's parameters (Eq. 2)", registry=REGISTRY
)
MODEL_UPDATES = Counter("alma_model_updates", "Training stages by kind", ["kind"], registry=REGISTRY)
RESERVOIR_RESTARTS = Counter(
    "alma_reservoir_restarts",
    "Stages that restarted a team's replay and validation sets: the stream had changed (stream.reservoir_reset)",
    registry=REGISTRY,
)
POLICY_DECISIONS = Counter("alma_policy_decisions", "Policy decisions by outcome", ["action"], registry=REGISTRY)
TRAIN_DURATION = Histogram(
    "alma_train_duration_seconds",
    "Duration of a training stage",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)

# -- the waiting-time policy's estimates (Decision.estimates; the adaptive and forecast policies') ---
#: Estimate name -> its gauge, set from each decision that carries it.
POLICY_ESTIMATES: dict[str, Gauge] = {
    "live_error": Gauge(
        "alma_policy_live_error_ratio",
        "Policy estimate: the live model's mean prequential error since its training stage",
        registry=REGISTRY,
    ),
    "previous_error": Gauge(
        "alma_policy_previous_error_ratio",
        "Policy estimate: the same for the model before the latest stage",
        registry=REGISTRY,
    ),
    "stage_gain_score": Gauge(
        "alma_policy_stage_gain_score",
        "Policy estimate: the latest stage's error gain, in standard errors",
        registry=REGISTRY,
    ),
    "drift_score": Gauge(
        "alma_policy_drift_score",
        "Policy estimate: the newest chunk's error above the live model's, in standard errors",
        registry=REGISTRY,
    ),
    "wait_chunks": Gauge(
        "alma_policy_wait_chunks", "Policy estimate: pending chunks the next stage waits for", registry=REGISTRY
    ),
    "wait_ratio": Gauge(
        "alma_policy_wait_ratio",
        "Policy estimate: the wait, in chunks pending per chunk trained on, with the lowest forecast anytime error",
        registry=REGISTRY,
    ),
    "forecast_slope": Gauge(
        "alma_policy_forecast_slope",
        "Policy estimate: the learning curve's slope c (error ~ chunks trained on ^ -c), fit on the recent stages",
        registry=REGISTRY,
    ),
    "forecast_slope_sd": Gauge(
        "alma_policy_forecast_slope_sd", "Policy estimate: the slope's standard deviation", registry=REGISTRY
    ),
    "forecast_gain": Gauge(
        "alma_policy_forecast_gain",
        "Policy estimate: the error a stage on the pending chunks would remove (forecast, priced policies)",
        registry=REGISTRY,
    ),
    "forecast_gain_sd": Gauge(
        "alma_policy_forecast_gain_sd", "Policy estimate: the forecast gain's standard deviation", registry=REGISTRY
    ),
}

# -- serving ------------------------------------------------------------------------------------
SWAP_DURATION = Histogram(
    "alma_swap_duration_seconds",
    "Checkpoint written to new version live",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60),
    registry=REGISTRY,
)
SWAPS = Counter("alma_swaps", "Versions promoted to live", registry=REGISTRY)
SWAP_FAILURES = Counter("alma_swap_failures", "Publishing attempts that failed, by stage", ["stage"], registry=REGISTRY)
PROMOTIONS_REFUSED = Counter("alma_promotions_refused", "Versions refused by the promotion guard", registry=REGISTRY)
MODEL_VERSION = Gauge("alma_model_version", "Latest trained model version", registry=REGISTRY)
LIVE_VERSION = Gauge("alma_live_model_version", "Version currently served as default", registry=REGISTRY)

# -- the service's own health -------------------------------------------------------------------
SERVER_UP = Gauge(
    "alma_server_up",
    "1 while the daemon reaches the server (redis, kafka), 0 during an outage",
    ["server"],
    registry=REGISTRY,
)
DEGRADED_SINCE = Gauge(
    "alma_degraded_since_timestamp_seconds",
    "Unix time since which a server has been unreachable; 0 while none is",
    registry=REGISTRY,
)


def _create_known_series() -> None:
    for reason in REJECT_REASONS:
        RECORDS_REJECTED.labels(reason)
    for kind in UPDATE_KINDS:
        MODEL_UPDATES.labels(kind)
    for action in DECISION_ACTIONS:
        POLICY_DECISIONS.labels(action)
    for stage in SWAP_STAGES:
        SWAP_FAILURES.labels(stage)
    for server in SERVERS:
        SERVER_UP.labels(server).set(math.nan)
    freshness = (MODEL_AGE_CHUNKS, LAST_STAGE_TIMESTAMP, FRESHNESS_BOUND_CHUNKS, FRESHNESS_BOUND_SECONDS)
    for gauge in (*POLICY_ESTIMATES.values(), *freshness):
        gauge.set(math.nan)
    for name in ERROR_SETS:
        ERROR_RATIO.labels(name).set(math.nan)
        PERPLEXITY.labels(name).set(math.nan)


_create_known_series()
