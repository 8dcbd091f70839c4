"""``alma config schema`` prints the config's JSON Schema; ``alma config check FILE`` validates a config file;
``alma config docs`` writes the config reference (docs/config.md, config.yaml) from the models' field descriptions.

Editors check a config.yaml against the schema as it is typed (with the YAML language server: a first
line ``# yaml-language-server: $schema=alma.schema.json``); ``check`` applies the same rules alma applies
at start-up, including those a schema cannot state (e.g. exactly one of policy.cron and interval_seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="the config's JSON Schema and reference, or check a config file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    schema = actions.add_parser("schema", help="print the JSON Schema of a config file (every learner and policy)")
    schema.set_defaults(func=print_schema)
    check = actions.add_parser("check", help="validate a config file (and --set overrides) as alma does at start-up")
    check.add_argument("file", nargs="?", help="the YAML config file")
    # Every other command names its config with --config; a user who types it here means the same.
    check.add_argument("--config", metavar="FILE", help="the same, as the other commands name it")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, as the other commands do, e.g. --set learner.width=16 (repeatable)",
    )
    check.set_defaults(func=check_file)
    docs = actions.add_parser(
        "docs", help="write the config reference (docs/config.md, config.yaml) from the config models' descriptions"
    )
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale, naming it")
    docs.add_argument("--root", default=".", metavar="DIR", help="the repository root the files are under (default: .)")
    docs.set_defaults(func=write_docs)


def write_docs(args: argparse.Namespace) -> int:
    """Write docs/config.md and config.yaml from the models' field descriptions, or with --check say which is stale."""
    from alma_daemon.config.reference import reference_files

    root = Path(args.root)
    stale = []
    for name, text in reference_files().items():
        path = root / name
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if args.check and stale:
        for name in stale:
            print(f"alma config docs: {root / name} is stale; run `alma config docs` to regenerate it", file=sys.stderr)
        return 1
    if not stale:
        print("the config reference is up to date")
    return 0


def print_schema(args: argparse.Namespace) -> int:
    from alma_daemon.config.loading import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def check_file(args: argparse.Namespace) -> int:
    from alma_daemon.config import ConfigError, load_config

    if args.file is None and args.config is None:
        print("alma config check: error: which config file? Give it as FILE or as --config FILE", file=sys.stderr)
        return 2  # a usage error, as argparse's
    if args.file is not None and args.config is not None:
        print("alma config check: error: give the config file as FILE or as --config FILE, not both", file=sys.stderr)
        return 2
    path = args.file or args.config
    config = load_config(path, args.overrides)
    from alma_daemon.core.task_fit import check_declared_task  # after the config: a config error needs no task

    check_declared_task(config)
    print(f"{path}: valid (learner {config.learner.name}, policy {config.policy.name})")
    try:
        config.policy.check_stream_length(config.stream.megabatches)
    except ConfigError as exc:
        # A live stream may go on past stream.megabatches, so only a simulated run refuses this.
        print(f"note: valid for alma run, but alma simulate and alma grid refuse it: {exc}")
    return 0
