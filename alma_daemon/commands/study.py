"""``alma study paper --out DIR [--seeds N] [--quick] [--jobs N]`` and ``alma study --list``: the
paper's findings reproduced, judged by rules in code, and drawn (alma_daemon/research/study.py)."""

from __future__ import annotations

import argparse
import sys

#: The studies ``alma study`` knows, by name.
STUDIES = ("paper",)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "study", help="run the experiments behind the paper's findings, judge each finding, write a report"
    )
    parser.add_argument("study", nargs="?", choices=STUDIES, help="which study (paper: findings F1-F9)")
    parser.add_argument("--list", action="store_true", help="list the studies, their experiments and findings")
    parser.add_argument("--out", "-o", help="folder for runs, findings.json, report.md/html; reused to resume")
    parser.add_argument("--seeds", type=int, help="seeds per run (default: 3, --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="a smaller scale (minutes, one seed)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="runs at once, one torch thread each")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.research.study import FULL, QUICK, describe, run_study

    scale = QUICK if args.quick else FULL
    if args.list:
        print(describe(scale=scale))
        return 0
    usage = None
    if args.study is None or args.out is None:
        usage = "give a study and --out (e.g. alma study paper --out runs/study), or --list"
    elif args.seeds is not None and args.seeds < 1:
        usage = f"--seeds must be >= 1; got {args.seeds}"
    if usage is not None:
        print(f"alma study: error: {usage}", file=sys.stderr)
        return 2  # a usage error, as argparse's
    findings = run_study(args.out, scale, seeds=args.seeds, jobs=max(1, args.jobs))
    for f in findings:
        print(f"{f['id']:<3} {f['verdict']:<14} {f['claim']}")
    print(f"findings: {args.out}/findings.json, report: {args.out}/report.html")
    return 0
