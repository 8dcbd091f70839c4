"""``alma simulate``: run one simulated stream and print its summary."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import Any

from alma_daemon.cli import add_config_arguments, check_config_under_ranks


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("simulate", help="replay a dataset as a stream through the engine")
    add_config_arguments(parser)
    parser.add_argument("--out", "-o", help="folder for results.json and series.csv")
    parser.add_argument("--checkpoints", help="also write every model version to this model-store folder")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics on this port while running (overrides metrics.port; 0 = off)",
    )
    parser.set_defaults(func=run)


def format_summary(summary: dict[str, Any]) -> str:
    from alma_daemon.observability.measure_words import summary_rows

    rows = [
        *summary_rows(summary),
        ("cumulative training FLOPs", summary.get("cumulative_train_flops"), "{:.4g}"),
        ("cumulative parameters", summary.get("cumulative_parameters"), "{:,}"),
        ("final parameters", summary.get("final_parameters"), "{:,}"),
        ("training stages", summary.get("stages"), "{}"),
        ("wall time (s)", summary.get("wall_seconds"), "{:.1f}"),
        # What reading a table left out: said beside the figures it would have moved.
        ("rows dropped (dataset.missing)", summary.get("rows_dropped") or None, "{:,}"),
        ("rows in no chunk (B equal chunks)", summary.get("rows_in_no_chunk") or None, "{:,}"),
        ("text columns not features", ", ".join(summary.get("text_columns") or []) or None, "{}"),
    ]
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  {fmt.format(value)}" for name, value, fmt in rows if value is not None)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.observability.exporter import MetricsObserver, start_exporter
    from alma_daemon.research.simulate import run_simulation
    from alma_daemon.runtime import resolve_device
    from alma_daemon.training.distributed import join_process_group, leave_process_group

    overrides = list(args.overrides)
    if args.metrics_port is not None:
        overrides.append(f"metrics.port={args.metrics_port}")
    config = load_config(args.config, overrides)
    check_config_under_ranks(config)
    world = join_process_group(resolve_device(config.device))
    with ExitStack() as stack:
        stack.callback(leave_process_group)
        observers = []
        if config.metrics.port and world.is_main:
            exporter = stack.enter_context(start_exporter(config.metrics.port, config.metrics.host))
            exporter.set_ready(True)
            observers.append(MetricsObserver(in_process_source=True))
        # Every rank runs the whole stream (see training/distributed.py); rank 0 reports it.
        results = run_simulation(
            config,
            args.out if world.is_main else None,
            progress=world.is_main and not args.no_progress,
            checkpoint_dir=args.checkpoints if world.is_main else None,
            observers=observers,
        )
    if world.is_main:
        print(format_summary(results["summary"]))
        if args.out:
            print(f"results: {args.out}/results.json")
    return 0
