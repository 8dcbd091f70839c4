"""``alma versions``: the model's checkpoint versions, their validation metrics, and which one is live."""

from __future__ import annotations

import argparse
import json
import sys

from alma_daemon.cli import add_config_arguments
from alma_daemon.config import load_config
from serving import make_publisher
from serving.publisher import PublishError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("versions", help="list model versions with their metrics and the live one")
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(func=run)


def version_rows(publisher) -> list[dict]:
    """One row per checkpoint version, oldest first; ``registered`` only for servers that load versions."""
    store = publisher.store
    live = publisher.live_version()
    try:
        served = publisher.served_versions()
    except PublishError as err:
        print(f"warning: cannot list the server's versions: {err}", file=sys.stderr)
        served = None
    rows = []
    for version in store.versions():
        metrics = store.metrics(version)
        row = {
            "version": version,
            "live": version == live,
            "validation_error": metrics.get("val_error"),
            "parameters": metrics.get("parameters"),
            "kind": metrics.get("kind"),
            "stage": metrics.get("stage"),
        }
        if "val_perplexity" in metrics:
            row["validation_perplexity"] = metrics["val_perplexity"]
        if publisher.kind != "local":
            row["registered"] = version in served if served is not None else None
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    columns = [
        c
        for c in ("version", "live", "validation_error", "validation_perplexity", "parameters", "kind", "registered")
        if any(c in row for row in rows)
    ]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    publisher = make_publisher(config)
    if publisher is None:
        raise ValueError("serving.kind is none: nothing is published")
    rows = version_rows(publisher)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print(format_table(rows))
    else:
        print(f"no versions in {publisher.store.folder}")
    return 0
