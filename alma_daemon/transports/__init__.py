"""Stream transports: how wire records travel from a producer to the daemon, one module per transport.

Each transport keeps its producer and its consumer side by side: :mod:`.kafka` (production: a Kafka
topic) and :mod:`.redis_stream` (the embedded default: a Redis stream, nothing else to install).
:mod:`.source` is the consumer interface that ingest reads from, and :mod:`.replay` turns a dataset
into a stream of chunks for ``alma replay`` and for the daemon's built-in replayer. The record's
path after a consumer is in ``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from alma_daemon.config import Config
from alma_daemon.registry import SOURCES as SOURCE_REGISTRY
from alma_daemon.registry import Registry
from alma_daemon.transports.source import RecordSource

#: ``kafka.transport`` -> its source's ``from_config``, from the entry points of group ``alma_daemon.sources``.
SOURCES = cast("Registry[Callable[[Config, Any], RecordSource]]", SOURCE_REGISTRY)


def build_source(config: Config, client: Any) -> RecordSource:
    """The transport named by ``kafka.transport``: a Kafka topic, or a Redis stream on ``client``."""
    return SOURCES[config.kafka.transport](config, client)
