"""``alma simulate``: run one simulated stream and print its summary."""

from __future__ import annotations

import argparse

from alma_daemon.cli import add_config_arguments
from alma_daemon.config import load_config
from alma_daemon.simulate import run_simulation


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="replay a dataset as a stream through the engine")
    add_config_arguments(parser)
    parser.add_argument("--out", "-o", help="folder for results.json and series.csv")
    parser.add_argument("--checkpoints", help="also write every model version to this model-store folder")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def format_summary(summary: dict) -> str:
    rows = [
        ("CER", summary.get("cer"), "{:.4f}"),
        ("final test error", summary.get("final_test_error"), "{:.4f}"),
        ("average test perplexity", summary.get("average_test_perplexity"), "{:.2f}"),
        ("final test perplexity", summary.get("final_test_perplexity"), "{:.2f}"),
        ("cumulative training FLOPs", summary.get("cumulative_train_flops"), "{:.4g}"),
        ("cumulative parameters", summary.get("cumulative_parameters"), "{:,}"),
        ("final parameters", summary.get("final_parameters"), "{:,}"),
        ("training stages", summary.get("stages"), "{}"),
        ("wall time (s)", summary.get("wall_seconds"), "{:.1f}"),
    ]
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  {fmt.format(value)}" for name, value, fmt in rows if value is not None)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    results = run_simulation(config, args.out, progress=not args.no_progress, checkpoint_dir=args.checkpoints)
    print(format_summary(results["summary"]))
    if args.out:
        print(f"results: {args.out}/results.json")
    return 0
