"""``alma status``: what the daemon is doing, read from Redis."""

from __future__ import annotations

import argparse
import json

from alma_daemon.cli import add_config_arguments
from alma_daemon.config import load_config
from alma_daemon.embedded import EMBEDDED_OVERRIDES, close_redis, connect_redis, embedded_db_path
from alma_daemon.redis_keys import StreamKeys
from alma_daemon.service_status import format_status, read_status


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("status", help="chunks received/buffered/trained, last decision, model, CER")
    add_config_arguments(parser)
    parser.add_argument("--embedded", action="store_true", help="read the embedded Redis under daemon.state_dir")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, [*args.overrides, *(EMBEDDED_OVERRIDES if args.embedded else ())])
    if not config.redis.url and not embedded_db_path(config).parent.is_dir():
        raise FileNotFoundError(f"no daemon state under {config.daemon.state_dir} (set redis.url or daemon.state_dir)")
    client = connect_redis(config)
    try:
        status = read_status(client, StreamKeys(config.daemon.stream), config.daemon.poll_seconds)
    finally:
        close_redis(client)
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    return 0
