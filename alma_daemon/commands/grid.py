"""``alma grid GRID.yaml --out DIR``: one simulation per combination of config values; exits 1 if any failed."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("grid", help="run a grid of simulations into one folder")
    parser.add_argument("grid", help="grid file (base config, fixed overrides, lists of values)")
    parser.add_argument("--out", "-o", required=True, help="folder collecting one sub-folder per run")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exits 1 when any run failed (the others still ran)."""
    from alma_daemon.research.grid import run_grid

    status = run_grid(args.grid, args.out, progress=not args.no_progress)
    failed = [r["name"] for r in status["runs"] if r["status"] != "ok"]
    print(
        f"{len(status['runs']) - len(failed)} run(s) ok, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0
