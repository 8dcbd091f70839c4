"""``alma replay``: publish a dataset (or a user's .npz arrays) as a stream of chunks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from alma_daemon.cli import add_config_arguments
from alma_daemon.data.wire_format import DEFAULT_MAX_PART_BYTES, EVENT_JSON, EVENT_ROWS

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from alma_daemon.transports.replay import EventFormat, ReplayReport

#: ``--events-format`` -> content type of the event records.
EVENT_FORMATS = {"json": EVENT_JSON, "rows": EVENT_ROWS}

#: Command-line flags that are shorthands for config keys.
FLAG_KEYS = {
    "dataset": "dataset.name",
    "megabatches": "stream.megabatches",
    "seed": "stream.seed",
    "topic": "kafka.topic",
    "bootstrap_servers": "kafka.bootstrap_servers",
    "stream": "daemon.stream",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("replay", help="publish a dataset as a stream of chunks (Kafka or embedded)")
    add_config_arguments(parser)
    parser.add_argument("--dataset", help="dataset to stream (mnist, cifar10, ptb, text, river); default: dataset.name")
    parser.add_argument(
        "--npz", metavar="FILE", help="stream your own arrays instead: a .npz with x (N x ...) and y (N)"
    )
    parser.add_argument("--megabatches", type=int, help="number of chunks B (stream.megabatches)")
    parser.add_argument("--seed", type=int, help="seed of the partition into chunks (stream.seed)")
    parser.add_argument("--topic", help="Kafka topic, or Redis stream name with --embedded (kafka.topic)")
    parser.add_argument("--bootstrap-servers", help="Kafka brokers, host:port[,host:port] (kafka.bootstrap_servers)")
    parser.add_argument("--stream", help="stream name in the records' headers (daemon.stream)")
    parser.add_argument(
        "--embedded", action="store_true", help="publish to the embedded Redis under daemon.state_dir instead of Kafka"
    )
    parser.add_argument(
        "--rate", help="at most this many chunks per time unit, e.g. 2/s, 30/m (default: as fast as possible)"
    )
    parser.add_argument(
        "--from-chunk",
        type=int,
        metavar="ID",
        help="skip chunks with smaller ids (default 1; with --embedded: after what the daemon has)",
    )
    parser.add_argument(
        "--max-part-bytes",
        type=int,
        default=DEFAULT_MAX_PART_BYTES,
        help=f"split chunks into records of at most this many bytes (default {DEFAULT_MAX_PART_BYTES})",
    )
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions of the topic if it is created (default 1)"
    )
    parser.add_argument(
        "--events",
        action="store_true",
        help="send each chunk's examples as event records (no chunk headers, no key) instead of chunk parts",
    )
    parser.add_argument(
        "--events-format",
        choices=sorted(EVENT_FORMATS),
        help="with --events: JSON objects (with stream.features: named fields) or safetensors rows (default json)",
    )
    parser.add_argument(
        "--events-per-record", type=int, metavar="N", help="with --events: examples per event record (default 1)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def replay_config(args: argparse.Namespace) -> Config:
    from alma_daemon.config import load_config
    from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES

    overrides = list(args.overrides)
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.npz:
        overrides.append("dataset.name=arrays")
    if args.embedded:
        overrides.extend(EMBEDDED_OVERRIDES)
    return load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.service.embedded_redis import close_redis, connect_redis
    from alma_daemon.transports.replay import (
        RecordFormat,
        ReplayPace,
        chunk_source,
        labeled_chunks,
        parse_rate,
        replay,
        replay_publisher,
    )

    config = replay_config(args)
    rate = parse_rate(args.rate)
    if args.npz:
        from alma_daemon.data.arrays import load_npz
        from alma_daemon.data.declared_task import declared_kind

        chunks = labeled_chunks(load_npz(args.npz, declared_kind(config.task) == "regression"), config)
    else:
        chunks = chunk_source(config)
    pace = ReplayPace(rate, total=config.stream.megabatches)
    wire = RecordFormat(args.max_part_bytes, event_format(args, config))
    # Only the embedded transport needs Redis: a Kafka replay runs without a service.
    client = connect_redis(config) if config.kafka.transport == "redis" else None
    try:
        publisher, first = replay_publisher(config, client, partitions=args.partitions)
        report = replay(
            chunks,
            publisher,
            config.daemon.stream,
            first_chunk=args.from_chunk or first,
            progress=not args.no_progress,
            pace=pace,
            wire=wire,
        )
    finally:
        if client is not None:
            close_redis(client)
    print(describe(report, config))
    return 0


def event_format(args: argparse.Namespace, config: Config) -> EventFormat | None:
    """What ``--events*`` ask for; None: chunk parts."""
    from alma_daemon.transports.replay import EventFormat

    if not args.events:
        if args.events_format is not None or args.events_per_record is not None:
            raise ValueError("--events-format and --events-per-record go with --events")
        return None
    content_type = EVENT_FORMATS[args.events_format or "json"]
    features = tuple(config.stream.features) if content_type == EVENT_JSON else ()
    per_record = 1 if args.events_per_record is None else args.events_per_record
    return EventFormat(content_type, per_record, features)


def describe(report: ReplayReport, config: Config) -> str:
    where = (
        f"Redis stream {config.kafka.topic}"
        if config.kafka.transport == "redis"
        else f"Kafka topic {config.kafka.topic}"
    )
    speed = report.bytes / 1e6 / report.seconds if report.seconds > 0 else 0.0
    return (
        f"published {report.chunks} chunk(s) of stream {config.daemon.stream} to {where}: {report.records} "
        f"record(s), {report.bytes / 1e6:.1f} MB in {report.seconds:.1f} s ({speed:.1f} MB/s)"
    )
