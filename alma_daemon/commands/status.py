"""``alma status``: what the daemon is doing, read from Redis (or, while Redis is down, from the
daemon's status file, with exit status 1)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alma_daemon.cli import add_config_arguments, add_embedded_argument, config_overrides


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="chunks received/buffered/trained, last decision, model and live versions, the model's age, the task's measure",
    )
    add_config_arguments(parser)
    add_embedded_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.infra.outages import REDIS_UNREACHABLE, one_line
    from alma_daemon.infra.redis_keys import StreamKeys
    from alma_daemon.infra.unreachable import ServerUnreachable
    from alma_daemon.service.embedded_redis import close_redis, connect_redis, embedded_db_path
    from alma_daemon.service.heartbeat import STATUS_FILE
    from alma_daemon.service.status import (
        format_local_status,
        format_status,
        freshness_bound,
        local_status,
        read_status,
        serving_state,
    )

    # A Redis that does not answer: at the connection (one line naming redis.url) or at a later command.
    redis_down: tuple[type[BaseException], ...] = (*REDIS_UNREACHABLE, ServerUnreachable)
    config = load_config(args.config, config_overrides(args))
    if not config.redis.url and not embedded_db_path(config).parent.is_dir():
        print(
            f"alma status: no daemon state under {config.daemon.state_dir}: no daemon has run with this config "
            f"(set redis.url, or daemon.state_dir to the daemon's)",
            file=sys.stderr,
        )
        return 1
    try:
        client = connect_redis(config)
        try:
            status = read_status(
                client,
                StreamKeys(config.daemon.stream),
                config.daemon.poll_seconds,
                serving_state(config),
                freshness_bound(config),
            )
        finally:
            close_redis(client)
    except redis_down as exc:
        # Exit 1: the full status lives in Redis; print what the daemon's own file says meanwhile.
        local = local_status(
            Path(config.daemon.state_dir) / STATUS_FILE,
            one_line(exc),
            config.daemon.poll_seconds,
            serving_state(config),
        )
        print(json.dumps(local, indent=1) if args.json else format_local_status(local))
        return 1
    print(json.dumps(status, indent=1) if args.json else format_status(status))
    return 0
