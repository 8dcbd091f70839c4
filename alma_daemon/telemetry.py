"""The Prometheus metrics of alma-daemon (DESIGN.md section 9), in one registry.

Every part of the service (ingest, buffer, engine, publisher) updates these objects; the exporter
(``/metrics``) renders :data:`REGISTRY`. Base units, ``_total`` for counters, and only small fixed
label sets (no ids or offsets as label values).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

CHUNKS_RECEIVED = Counter("alma_chunks_received", "Complete chunks received", registry=REGISTRY)
EXAMPLES_RECEIVED = Counter("alma_examples_received", "Examples received in complete chunks", registry=REGISTRY)
RECORDS_REJECTED = Counter("alma_records_rejected", "Records sent to the dead-letter stream, by reason",
                           ["reason"], registry=REGISTRY)
BUFFER_CHUNKS = Gauge("alma_buffer_chunks", "Chunks held in the buffer", registry=REGISTRY)
INGEST_LAG = Gauge("alma_ingest_lag_records", "Records on the topic not yet ingested", registry=REGISTRY)
ERROR_RATIO = Gauge("alma_error_ratio", "Error after the latest chunk (test) or on it before training (prequential)",
                    ["set"], registry=REGISTRY)
CUMULATIVE_ERROR = Gauge("alma_cumulative_error", "CER so far: sum of test errors over chunks (Eq. 1)",
                         registry=REGISTRY)
CUMULATIVE_PREQUENTIAL_ERROR = Gauge("alma_cumulative_prequential_error",
                                     "Sum of prequential errors over chunks", registry=REGISTRY)
TRAIN_FLOPS = Counter("alma_train_flops", "Training FLOPs spent (forward + backward)", registry=REGISTRY)
PARAMETERS = Gauge("alma_parameters", "Parameters of the current model", registry=REGISTRY)
CUMULATIVE_PARAMETERS = Gauge("alma_cumulative_parameters", "Sum over chunks of the model's parameters (Eq. 2)",
                              registry=REGISTRY)
MODEL_UPDATES = Counter("alma_model_updates", "Training stages by kind", ["kind"], registry=REGISTRY)
POLICY_DECISIONS = Counter("alma_policy_decisions", "Policy decisions by outcome", ["action"], registry=REGISTRY)
TRAIN_DURATION = Histogram("alma_train_duration_seconds", "Duration of a training stage",
                           buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600), registry=REGISTRY)
SWAP_DURATION = Histogram("alma_swap_duration_seconds", "Checkpoint written to new version live",
                          buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60), registry=REGISTRY)
SWAPS = Counter("alma_swaps", "Versions promoted to live", registry=REGISTRY)
SWAP_FAILURES = Counter("alma_swap_failures", "Publishing attempts that failed, by stage",
                        ["stage"], registry=REGISTRY)
PROMOTIONS_REFUSED = Counter("alma_promotions_refused", "Versions refused by the promotion guard",
                             registry=REGISTRY)
MODEL_VERSION = Gauge("alma_model_version", "Latest trained model version", registry=REGISTRY)
LIVE_VERSION = Gauge("alma_live_model_version", "Version currently served as default", registry=REGISTRY)
