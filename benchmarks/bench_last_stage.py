"""Ens under geometric 0.5 with its last stage moved: can knowing the stream's end meet both targets?

Issue 13 asks for a CER never above geometric 0.5's and, on Ens (MNIST, B = 500, 5 members of width
8), at most 1.5 x the FLOPs of the best schedule, geometric 1, which never trains after chunk 256.
Geometric 0.5 trains at chunks ..., 210, 315 and 473. This runs it with the stage at 473 moved to
each chunk of ``--last`` (nothing after it), so that only the stream's known end decides the last
stage, and sets each beside geometric 0.5 and 1 from ``bench_policy.py``'s cache (run that first).

    nice python benchmarks/bench_last_stage.py --last 384 402 --seeds 0 1 2 --jobs 2

Runs are cached in ``--runs``; each uses one torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from policy_settings import (  # a helper beside this script: its folder is on sys.path when it runs
    RESULTS,
    SETTINGS,
    policy_label,
    run_key,
    run_missing,
    run_one,
)

from alma_daemon.research.run_pool import PoolRun, RecordFile

SETTING = "mnist-ens8"
GEOMETRIC = {"policy.name": "geometric", "policy.ratio": 0.5}
BASELINES = [GEOMETRIC, {"policy.name": "geometric", "policy.ratio": 1.0}]
#: geometric 0.5's stage before its last one on a stream of 500 chunks.
PREVIOUS_STAGE = 315


def run_moved(last: int, seed: int, common: dict) -> dict:
    """geometric 0.5 until chunk PREVIOUS_STAGE, then one stage at chunk ``last`` (in this run only)."""
    from policies.base import Decision, PolicyState
    from policies.geometric import Geometric

    plain = Geometric.decide

    def decide(self: Geometric, state: PolicyState) -> Decision:
        if state.chunks_seen - state.chunks_pending < PREVIOUS_STAGE:
            return plain(self, state)
        if state.chunks_seen == last:
            return Decision.train(f"the last stage, moved to chunk {last}")
        if state.chunks_seen < last:
            return Decision.wait(f"waiting for the last stage at chunk {last}")
        return Decision.wait(f"the last stage was at chunk {last}")

    # A pool worker, or this process at --jobs 1, runs several of them: the patch must not outlive this one.
    Geometric.decide = decide
    try:
        return {**run_one(SETTING, GEOMETRIC, seed, common, False), "last_stage": last}
    finally:
        Geometric.decide = plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--last", nargs="+", type=int, default=[384, 402])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")
    parser.add_argument("--runs", type=Path, default=RESULTS / "last_stage_runs.json")
    parser.add_argument("--policy-runs", type=Path, default=RESULTS / "policy_runs.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "last_stage.md")
    args = parser.parse_args()
    if min(args.last) <= PREVIOUS_STAGE:
        parser.error(f"--last: the moved stage must come after chunk {PREVIOUS_STAGE}, the stage before it")

    common = {"train.epochs": 10, "dataset.test_examples": 1000, "device": "cpu"}
    policy_runs = RecordFile(args.policy_runs).records
    baseline_keys = {run_key(SETTING, p, s, common) for p in BASELINES for s in args.seeds}
    if not baseline_keys <= policy_runs.keys():
        sys.exit(f"{args.policy_runs} lacks geometric 0.5 or 1 runs of {SETTING}: run bench_policy.py first")
    cache = RecordFile(args.runs)

    def key(last: int, seed: int) -> str:
        return json.dumps({"last_stage": last, "seed": seed, "common": common})

    tasks = [PoolRun(key(last, s), run_moved, (last, s, common)) for last in args.last for s in args.seeds]
    run_missing(tasks, cache, args.jobs)
    runs = cache.records

    rows = {policy_label(p): [policy_runs[run_key(SETTING, p, s, common)] for s in args.seeds] for p in BASELINES}
    for last in args.last:
        rows[f"geometric 0.5, last stage at {last}"] = [runs[key(last, s)] for s in args.seeds]
    cheapest = statistics.fmean(r["cumulative_train_flops"] for r in rows["geometric 1"])
    lines = [
        "# Ens: geometric 0.5 with its last stage moved",
        "",
        f"`nice python benchmarks/bench_last_stage.py --last {' '.join(map(str, args.last))} "
        f"--seeds {' '.join(map(str, args.seeds))}`  ",
        f"{SETTINGS[SETTING][2]}; seeds {args.seeds}. FLOPs relative to geometric 1's.",
        "",
        "| policy | last stages | CER (mean) | CER per seed | FLOPs / geometric 1 |",
        "|---|---|---:|---|---:|",
    ]
    for name, records in rows.items():
        cer = [r["cer"] for r in records]
        flops = statistics.fmean(r["cumulative_train_flops"] for r in records) / cheapest
        stages = ", ".join(map(str, records[0]["trained_at"][-3:]))
        lines.append(
            f"| {name} | {stages} | {statistics.fmean(cer):.2f} | {', '.join(f'{c:.1f}' for c in cer)} | {flops:.2f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
