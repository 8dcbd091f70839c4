"""Stream transports: how wire records travel from a producer to the daemon, one module per transport.

Each transport keeps its producer and its consumer side by side: :mod:`.kafka` (production: a Kafka
topic) and :mod:`.redis_stream` (the embedded default: a Redis stream, nothing else to install).
:mod:`.source` is the consumer interface that ingest reads from, and :mod:`.replay` turns a dataset
into a stream of chunks for ``alma replay`` and for the daemon's built-in replayer. The record's
path after a consumer is in ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import Any

from alma_daemon.config import Config
from alma_daemon.infra.connections import kafka_security
from alma_daemon.transports.source import RecordSource


def build_source(config: Config, client: Any) -> RecordSource:
    """The transport named by ``kafka.transport``: a Kafka topic, or a Redis stream on ``client``."""
    if config.kafka.transport == "redis":
        from alma_daemon.transports.redis_stream import RedisStreamSource

        return RedisStreamSource(client, config.kafka.topic)
    from alma_daemon.transports.kafka import KafkaSource

    return KafkaSource(config.kafka.bootstrap_servers, config.kafka.topic, kafka_security(config.kafka))
