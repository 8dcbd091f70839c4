"""``alma ablate-iid --config FILE --chunks k --out FILE``: sequential vs. i.i.d. training (paper table 1)."""

from __future__ import annotations

import argparse
from pathlib import Path

from alma_daemon.cli import add_config_arguments


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ablate-iid",
        help="train on the first k chunks sequentially and all at once; compare (same steps only with train.steps_per_chunk)",
    )
    add_config_arguments(parser)
    parser.add_argument("--chunks", "-k", type=int, required=True, help="how many chunks of the stream (k)")
    parser.add_argument("--out", "-o", required=True, help="JSON file for both runs' results")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.core.atomic_json import write_json_atomic
    from alma_daemon.research.ablation import ablate_iid

    if args.chunks < 1:
        raise ValueError(f"--chunks must be >= 1; got {args.chunks}")
    config = load_config(args.config, args.overrides)
    results = ablate_iid(config, args.chunks, progress=not args.no_progress)
    write_json_atomic(Path(args.out), results)
    key = f"test_{results['measure']}"
    for mode in ("sequential", "iid"):
        r = results[mode]
        print(f"{mode:<10}  {key} {r[key]:.2f}  steps {r['steps']}  train FLOPs {r['train_flops']:.4g}")
    print(f"results: {args.out}")
    return 0
