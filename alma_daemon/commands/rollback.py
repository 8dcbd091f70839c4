"""``alma rollback --to V``: make an earlier version the default again (no promotion guard)."""

from __future__ import annotations

import argparse

from alma_daemon.cli import add_config_arguments, add_embedded_argument, config_overrides


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("rollback", help="serve an earlier model version by default again")
    add_config_arguments(parser)
    add_embedded_argument(parser)
    parser.add_argument("--to", type=int, required=True, metavar="VERSION", help="the version to make live")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from serving.publishing import make_publisher

    config = load_config(args.config, config_overrides(args))
    publisher = make_publisher(config)
    if publisher is None:
        raise ValueError("serving.kind is none: nothing is published, so nothing can be rolled back")
    replaced = publisher.rollback(args.to)
    print(f"version {args.to} is live" + (f" (was {replaced})" if replaced not in (None, args.to) else ""))
    return 0
