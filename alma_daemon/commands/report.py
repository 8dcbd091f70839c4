"""``alma report DIR``: plots and a markdown table over the runs in a folder."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("report", help="plots + markdown table of every run under a folder")
    parser.add_argument("folder", help="a run folder, a grid folder, or a daemon state folder")
    parser.add_argument("--out", "-o", help="where to write the report (default: the folder itself)")
    parser.add_argument(
        "--html", action="store_true", help="also write report.html: table and plots in one self-contained page"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.observability.report import write_report

    print(f"report: {write_report(args.folder, args.out, html=args.html)}")
    return 0
