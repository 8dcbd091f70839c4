"""``alma replay``: publish a dataset as a stream of chunks, in the wire format of docs/wire-format.md.

A *chunk source* yields the stream's chunks in order; a *publisher* sends each chunk's records
(split under the size limit by ``wire.encode_chunk``) to a Kafka topic or, in embedded mode, to a
Redis stream (:func:`replay_publisher` picks it, for ``alma replay`` and ``alma run --replay``).
Dataset replays use the same seeded partition into mega-batches as ``alma simulate`` (a River
stream, a team's table: the same contiguous chunks in the stream's order), so the daemon sees exactly
the chunks the simulator sees.

:data:`CHUNK_SOURCES` maps ``dataset.name`` to a source. Image datasets, River streams and tables send ``x``/``y``; text
corpora (PTB, a user's text files) send each chunk as its run of ``tokens`` (int32), which the
daemon cuts into the same sequences the simulator trains on. With :class:`EventFormat`, a labeled
chunk's examples travel as event records (``events.encode_events``) instead of chunk parts.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from tqdm import tqdm

from alma_daemon.config import Config, ConfigError
from alma_daemon.data.datasets import TaskInfo, load_dataset
from alma_daemon.data.events import encode_events
from alma_daemon.data.river_streams import read_configured_river
from alma_daemon.data.streams import build_drift, drifted, megabatch_stream, ordered_stream
from alma_daemon.data.table import read_table
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import text_stream, token_run
from alma_daemon.data.wire import WireRecord, encode_chunk
from alma_daemon.data.wire_format import DEFAULT_MAX_PART_BYTES, EVENT_JSON, HEADER_CHUNK
from alma_daemon.infra.connections import kafka_security
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.transports.redis_stream import RedisStreamPublisher, decode_entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayChunk:
    """One chunk to publish: its id and its tensors (``x`` and ``y``, or ``tokens``)."""

    chunk_id: int
    tensors: dict[str, torch.Tensor]


def labeled_chunks(data: LabeledData, config: Config, task: TaskInfo | None = None) -> Iterator[ReplayChunk]:
    """``data`` partitioned into ``stream.megabatches`` chunks exactly as the simulator does, drifted
    from ``stream.drift.at`` on as the simulator drifts them. ``task`` describes the examples (None:
    the arrays declared in ``dataset.*``). A drift these examples cannot take fails here, before
    anything is published."""
    drift = None
    if config.stream.drift.kind != "none":
        from alma_daemon.data.declared_task import arrays_task

        drift = build_drift(config.stream.drift, task or arrays_task(config.dataset, config.task), config.stream.seed)
    chunks = megabatch_stream(data, config.stream.megabatches, config.stream.seed, limit=config.stream.train_examples)
    return (ReplayChunk(chunk.index, {"x": chunk.data.x, "y": chunk.data.y}) for chunk in drifted(chunks, drift))


def dataset_chunks(config: Config) -> Iterator[ReplayChunk]:
    """The training set of ``dataset.name`` as the simulator streams it."""
    dataset = load_dataset(config.dataset.name, config.dataset.root)
    return labeled_chunks(dataset.train, config, dataset.task)


def river_chunks(config: Config) -> Iterator[ReplayChunk]:
    """A River stream as the simulator streams it: contiguous chunks in River's order (docs/river.md)."""
    river = read_configured_river(config.dataset, config.stream.seed)
    drift = build_drift(config.stream.drift, river.task, config.stream.seed)
    chunks = ordered_stream(river.train, config.stream.megabatches, limit=config.stream.train_examples)
    return (ReplayChunk(chunk.index, {"x": chunk.data.x, "y": chunk.data.y}) for chunk in drifted(chunks, drift))


def table_chunks(config: Config) -> Iterator[ReplayChunk]:
    """A team's history as the simulator streams it: contiguous chunks in time order, the test share left out."""
    table = read_table(config)
    drift = build_drift(config.stream.drift, table.task, config.stream.seed)
    chunks = ordered_stream(table.train, config.stream.megabatches, limit=config.stream.train_examples)
    return (ReplayChunk(chunk.index, {"x": chunk.data.x, "y": chunk.data.y}) for chunk in drifted(chunks, drift))


def text_chunks(config: Config) -> Iterator[ReplayChunk]:
    """The corpus of ``dataset.name`` as the simulator streams it: each chunk's contiguous tokens (a
    drift fails here, before anything is published: text has no labels to permute)."""
    if config.stream.drift.kind != "none":
        raise ConfigError(
            f"stream.drift.kind: {config.stream.drift.kind} needs labeled examples; "
            f"dataset {config.dataset.name!r} is text"
        )
    chunks = text_stream(config.dataset, config.stream).chunks
    return (ReplayChunk(chunk.index, {"tokens": token_run(chunk.data).to(torch.int32)}) for chunk in chunks)


#: ``dataset.name`` -> the chunks of its stream.
CHUNK_SOURCES: dict[str, Callable[[Config], Iterator[ReplayChunk]]] = {
    "mnist": dataset_chunks,
    "cifar10": dataset_chunks,
    "ptb": text_chunks,
    "text": text_chunks,
    "river": river_chunks,
    "table": table_chunks,
}


def chunk_source(config: Config) -> Iterator[ReplayChunk]:
    if config.dataset.name not in CHUNK_SOURCES:
        raise ValueError(
            f"alma replay cannot stream dataset {config.dataset.name!r} yet; it streams "
            f"{', '.join(sorted(CHUNK_SOURCES))} and .npz arrays (--npz)"
        )
    return CHUNK_SOURCES[config.dataset.name](config)


# -- the transport's producer side ---------------------------------------------------------------------------------
class Publisher(Protocol):
    """Sends wire records to a transport."""

    def send(self, records: list[WireRecord]) -> None: ...

    def close(self) -> None:
        """Wait until everything sent is acknowledged, then release the connection."""
        ...


def resume_point(client: Any, keys: StreamKeys, transport_stream: str | None = None) -> int:
    """The first chunk a replay into a running service still has to send.

    Chunks up to the last one ingest completed are in Redis already. With the Redis-stream transport,
    the newest chunk still waiting in ``transport_stream`` may be partial (an interrupted replay): it
    is sent again whole, and its parts already there are duplicates, stored once.
    """
    first = int(client.hget(keys.ingest, "last_completed") or 0) + 1
    newest = client.xrevrange(transport_stream, count=1) if transport_stream else []
    if newest:
        _, fields = newest[0]
        _, _, headers, _ = decode_entry(fields)
        chunk = dict(headers or []).get(HEADER_CHUNK, b"")
        if chunk.isdigit():
            first = max(first, int(chunk))
    return first


def replay_publisher(
    config: Config, client: Any | None, *, partitions: int = 1, stop: Callable[[], bool] = lambda: False
) -> tuple[Publisher, int]:
    """The publisher to ``config``'s transport, and the first chunk a replay still has to send.

    ``client`` is the service's Redis: with the Redis-stream transport the stream lives there (a
    client is needed); with Kafka it says what the daemon has ingested already, and without it the
    replay starts at chunk 1. ``partitions`` is for a Kafka topic that does not exist yet; ``stop``
    lets a Redis-stream publisher stop waiting for the daemon to catch up.
    """
    keys = StreamKeys(config.daemon.stream)
    if config.kafka.transport == "redis":
        first = resume_point(client, keys, config.kafka.topic)
        return RedisStreamPublisher(client, config.kafka.topic, stop=stop), first
    # Kafka's client library only when Kafka is the transport, as for the consumer (transports/__init__.py).
    from alma_daemon.transports.kafka import KafkaPublisher

    publisher = KafkaPublisher(
        config.kafka.bootstrap_servers, config.kafka.topic, partitions, kafka_security(config.kafka)
    )
    return publisher, resume_point(client, keys) if client is not None else 1


# -- the replay loop ------------------------------------------------------------------------------
def parse_rate(text: str | None) -> float | None:
    """Chunks per second from ``"2/s"``, ``"30/m"`` or ``"100/h"`` (a bare number means per second)."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(?:/\s*([smh]))?\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--rate {text!r}: expected a positive number of chunks per time unit, e.g. 2/s or 30/m")
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) / per


@dataclass(frozen=True)
class EventFormat:
    """Send each chunk's examples as event records of ``per_record`` examples, written as
    ``content_type`` (JSON with the named ``features``, if any). Records have no key, so that
    Kafka's partitioner spreads them over the topic's partitions."""

    content_type: str = EVENT_JSON
    per_record: int = 1
    features: tuple[str, ...] = ()


@dataclass
class ReplayReport:
    chunks: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ReplayPace:
    """How fast a replay goes and how far: at most ``rate`` chunks per second (None: as fast as the
    publisher takes them), of ``total`` chunks in all (the progress bar's length; None: not known)."""

    rate: float | None = None
    total: int | None = None


@dataclass(frozen=True)
class RecordFormat:
    """The records a chunk travels in: chunk parts of at most ``max_part_bytes`` each or, with ``events``,
    event records."""

    max_part_bytes: int = DEFAULT_MAX_PART_BYTES
    events: EventFormat | None = None


def replay(
    chunks: Iterable[ReplayChunk],
    publisher: Publisher,
    stream: str,
    *,
    first_chunk: int = 1,
    progress: bool = True,
    stop: Callable[[], bool] = lambda: False,
    pace: ReplayPace = ReplayPace(),
    wire: RecordFormat = RecordFormat(),
) -> ReplayReport:
    """Publish every chunk with id >= ``first_chunk``, at most ``pace.rate`` chunks per second, in the
    records of ``wire``, until ``stop()`` says so."""
    report = ReplayReport()
    start = time.monotonic()
    bar = tqdm(total=pace.total, unit="chunk", disable=not progress, dynamic_ncols=True, desc=f"replay {stream}")
    try:
        for chunk in chunks:
            if stop():
                break
            if chunk.chunk_id < first_chunk:
                bar.update(1)
                continue
            if pace.rate is not None:
                time.sleep(max(0.0, start + report.chunks / pace.rate - time.monotonic()))
            if wire.events is None:
                records = encode_chunk(stream, chunk.chunk_id, max_part_bytes=wire.max_part_bytes, **chunk.tensors)
            elif "x" in chunk.tensors:
                x, y = chunk.tensors["x"], chunk.tensors["y"]
                events = wire.events
                records = encode_events(
                    x, y, events.content_type, events.features, events.per_record, max_part_bytes=wire.max_part_bytes
                )
            else:
                raise ValueError(f"event records carry labeled examples; stream {stream!r} is text")
            publisher.send(records)
            report.chunks += 1
            report.records += len(records)
            report.bytes += sum(len(r.value) for r in records)
            bar.set_postfix({"MB": f"{report.bytes / 1e6:.1f}"}, refresh=False)
            bar.update(1)
        publisher.close()
    finally:
        bar.close()
    report.seconds = time.monotonic() - start
    log.info(
        "replay done",
        extra={
            "stream": stream,
            "chunks": report.chunks,
            "records": report.records,
            "bytes": report.bytes,
            "seconds": round(report.seconds, 3),
        },
    )
    return report
