"""``alma versions``: the model's checkpoint versions, their validation metrics, and which one is live.

The table shows the newest :data:`DEFAULT_LAST` versions (``--last N``, ``--last 0`` for all) and the
live one wherever it is, and says how many older ones it left out; ``--json`` prints every version
unless ``--last`` is given."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from alma_daemon.cli import add_config_arguments, add_embedded_argument, config_overrides

if TYPE_CHECKING:
    from alma_daemon.config import Config
    from alma_daemon.core.checkpoint_index import CheckpointIndex

#: Versions the table shows without ``--last``: a daemon that has run a while has hundreds.
DEFAULT_LAST = 20


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("versions", help="list model versions with their metrics and the live one")
    add_config_arguments(parser)
    add_embedded_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument(
        "--last",
        type=_count,
        metavar="N",
        help=f"only the N newest versions, and the live one (0: all; default: {DEFAULT_LAST} in the table, "
        "all with --json)",
    )
    parser.set_defaults(func=run)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, not {value}")
    return value


def shown_versions(versions: list[int], live: int | None, last: int | None) -> list[int]:
    """The ``last`` newest of ``versions`` (all for None or 0), and ``live`` if it is older, in order."""
    if not last or last >= len(versions):
        return list(versions)
    newest = list(versions[-last:])
    return sorted({*newest, live}) if live in versions else newest


def version_rows(
    store: CheckpointIndex, live: int | None, served: list[int] | None, registers: bool, last: int | None = None
) -> list[dict[str, Any]]:
    """One row per checkpoint version (the ``last`` newest and the live one, see
    :func:`shown_versions`), oldest first; ``registered`` only for servers that load versions
    (``registers``), None where the server could not say (``served`` None)."""
    rows = []
    for version in shown_versions(store.versions(), live, last):
        metrics = store.metrics(version)
        if metrics is None:
            continue  # deleted since it was listed (daemon.keep_checkpoints)
        row = {"version": version, "live": version == live, **validation_values(metrics)}
        row |= {"parameters": metrics.get("parameters"), "kind": metrics.get("kind"), "stage": metrics.get("stage")}
        if metrics.get("threshold") is not None:
            row["threshold"] = metrics["threshold"]
        if registers:
            row["registered"] = version in served if served is not None else None
        rows.append(row)
    return rows


def validation_values(metrics: dict[str, Any]) -> dict[str, Any]:
    """A version's validation measures, ``validation_<measure>`` each: the task's measure (``val_cost`` of a
    cost-judged task), a language model's perplexity beside its error; ``validation_error`` None where
    the stage recorded none."""
    values = {f"validation_{key[4:]}": value for key, value in metrics.items() if key.startswith("val_")}
    return values or {"validation_error": None}


def served_versions(config: Config) -> list[int] | None:
    """The versions the server has loaded (TorchServe), None where it cannot say. Asked through the
    publisher, which imports torch; listing the model store needs neither."""
    from serving.publishing import make_publisher
    from serving.publishing.publisher import PublishError

    publisher = make_publisher(config)
    assert publisher is not None  # run() asks only a server that loads versions
    try:
        return publisher.served_versions()
    except PublishError as err:
        print(f"warning: cannot list the server's versions: {err}", file=sys.stderr)
        return None


def format_table(rows: list[dict[str, Any]]) -> str:
    validation = list(dict.fromkeys(c for row in rows for c in row if c.startswith("validation_")))
    columns = [
        c
        for c in ("version", "live", *validation, "threshold", "parameters", "kind", "registered")
        if any(c in row for row in rows)
    ]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.core.checkpoint_index import CheckpointIndex
    from serving.publishing.live_pointer import LivePointer

    config = load_config(args.config, config_overrides(args))
    if config.serving.kind == "none":
        raise ValueError("serving.kind is none: nothing is published")
    store = CheckpointIndex(config.daemon.checkpoint_dir, config.serving.model_name)
    live = LivePointer(store.folder).read().live
    # The local server is the live pointer itself: it loads no versions, and has no column for them.
    registers = config.serving.kind != "local"
    served = served_versions(config) if registers else None
    last = args.last if args.last is not None or args.json else DEFAULT_LAST
    rows = version_rows(store, live, served, registers, last)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no versions in {store.folder}")
        return 0
    print(format_table(rows))
    hidden = len(store.versions()) - len(rows)
    if hidden:
        print(f"({hidden} older version(s) not shown: --last N shows the N newest, --last 0 all)")
    return 0
