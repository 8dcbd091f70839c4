"""Ingest: records from Kafka (or a Redis stream) into the Redis buffer, exactly once.

Reading order for one record: :mod:`.kafka_source` (or :mod:`.redis_stream_source`) ->
:mod:`.worker` (validation with ``data/wire.py``) -> :mod:`.assembler` -> :mod:`.store` (one
MULTI/EXEC with the offsets). The engine side continues in ``alma_daemon/redis_buffer.py``.
"""

from __future__ import annotations

from typing import Any

from alma_daemon.config import Config
from alma_daemon.connections import kafka_security
from alma_daemon.ingest.source import RecordSource, SourceRecord
from alma_daemon.ingest.worker import IngestWorker


def build_source(config: Config, client: Any) -> RecordSource:
    """The transport named by ``kafka.transport``: a Kafka topic, or a Redis stream on ``client``."""
    if config.kafka.transport == "redis":
        from alma_daemon.ingest.redis_stream_source import RedisStreamSource

        return RedisStreamSource(client, config.kafka.topic)
    from alma_daemon.ingest.kafka_source import KafkaSource

    return KafkaSource(config.kafka.bootstrap_servers, config.kafka.topic, kafka_security(config.kafka))


__all__ = ["IngestWorker", "RecordSource", "SourceRecord", "build_source"]
