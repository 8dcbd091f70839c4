"""gEns growth under the adaptive policy: how its growth factor was chosen, and how it held up.

The adaptive policy grows a learner whose growth adds an untrained part (gEns) each time the chunks
trained on reach ``GROWTH_FACTOR`` x those trained on when its newest member was added
(``policies/adaptive.py``). This sweep runs the adaptive policy on ``mnist-gens8`` (MNIST, B = 500,
gEns width 8, the setting of ``bench_policy.py``) with other factors, and sets each beside the
``grow_every`` schedules of ``bench_policy.py``'s cache on the same seeds (run that first: the
baselines are read from it, not run again). The factor was chosen on seeds 0-11 and judged on 12-23:

    nice python benchmarks/bench_gens_growth.py --factors 2 3 4 6 8 --seeds 0 1 2 3 4 5 6 7 8 9 10 11 --jobs 2

Runs are cached in ``--runs`` as in ``bench_policy.py``; each uses one torch thread.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from policy_settings import (  # a helper beside this script: its folder is on sys.path when it runs
    GROW_EVERY,
    RESULTS,
    SETTINGS,
    policy_label,
    run_key,
    run_missing,
    run_one,
)

from alma_daemon.research.run_pool import PoolRun, RecordFile

SETTING = "mnist-gens8"
BASELINES = [{"policy.name": "geometric", "policy.grow_every": k} for k in GROW_EVERY]


def run_factor(factor: int, seed: int, common: dict) -> dict:
    """One adaptive run with the growth factor replaced (in this run only)."""
    import policies.adaptive

    # A pool worker, or this process at --jobs 1, runs several of them: the factor must not outlive this one.
    chosen = policies.adaptive.GROWTH_FACTOR
    policies.adaptive.GROWTH_FACTOR = factor
    try:
        record = run_one(SETTING, {"policy.name": "adaptive"}, seed, common, False)
    finally:
        policies.adaptive.GROWTH_FACTOR = chosen
    return {**record, "growth_factor": factor}


def factor_key(factor: int, seed: int, common: dict) -> str:
    return json.dumps({"growth_factor": factor, "seed": seed, "common": common}, sort_keys=True)


def paired(ours: list[float], theirs: list[float]) -> str:
    """Mean per-seed difference, with its standard error when there are two seeds or more."""
    differences = [a - b for a, b in zip(ours, theirs)]
    if len(differences) < 2:
        return f"{differences[0]:+.2f}"
    spread = statistics.stdev(differences) / math.sqrt(len(differences))
    return f"{statistics.fmean(differences):+.2f} ({spread:.2f})"


def markdown(rows: dict[str, list[dict]], seeds: list[int], command: str) -> str:
    """The table: each growth timing's CER, and the chunks it grew at (one list if the seeds agree)."""
    cer = {name: [r["cer"] for r in records] for name, records in rows.items()}
    best = min((name for name in cer if name.startswith("grow_every")), key=lambda n: statistics.fmean(cer[n]))
    lines = [
        "# gEns growth factor of the adaptive policy",
        "",
        f"`{command}`  ",
        f"{SETTINGS[SETTING][2]}; seeds {seeds}; geometric 0.5 wait throughout. CER per seed,",
        f"and the per-seed difference to the best `grow_every` here ({best}), with its standard error.",
        "",
        "| growth | grew at chunks | CER (mean) | vs best grow_every | CER per seed |",
        "|---|---|---:|---:|---|",
    ]
    for name, records in rows.items():
        grew = {tuple(r["grew_at"]) for r in records}
        grew_at = ", ".join(map(str, grew.pop())) if len(grew) == 1 else "differs by seed"
        per_seed = ", ".join(f"{c:.1f}" for c in cer[name])
        lines.append(
            f"| {name} | {grew_at} | {statistics.fmean(cer[name]):.2f} | {paired(cer[name], cer[best])} | {per_seed} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--factors", nargs="+", type=int, default=[2, 3, 4, 6, 8])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(12)))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")
    parser.add_argument("--runs", type=Path, default=RESULTS / "gens_growth_runs.json")
    parser.add_argument("--policy-runs", type=Path, default=RESULTS / "policy_runs.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "gens_growth.md")
    args = parser.parse_args()

    common = {"train.epochs": 10, "dataset.test_examples": 1000, "device": "cpu"}
    policy_runs = RecordFile(args.policy_runs).records
    missing = [
        (policy_label(p), s) for p in BASELINES for s in args.seeds if run_key(SETTING, p, s, common) not in policy_runs
    ]
    if missing:
        sys.exit(
            f"{args.policy_runs} lacks {len(missing)} grow_every run(s), e.g. {missing[0]}: run "
            f"bench_policy.py --settings {SETTING} --seeds {' '.join(map(str, args.seeds))} first"
        )
    cache = RecordFile(args.runs)
    tasks = [PoolRun(factor_key(f, s, common), run_factor, (f, s, common)) for f in args.factors for s in args.seeds]
    run_missing(tasks, cache, args.jobs)
    runs = cache.records

    rows = {
        policy_label(p).removeprefix("geometric 0.5, "): [
            policy_runs[run_key(SETTING, p, s, common)] for s in args.seeds
        ]
        for p in BASELINES
    }
    for factor in args.factors:
        rows[f"adaptive, factor {factor}"] = [runs[factor_key(factor, s, common)] for s in args.seeds]
    command = (
        f"nice python benchmarks/bench_gens_growth.py --factors {' '.join(map(str, args.factors))} "
        f"--seeds {' '.join(map(str, args.seeds))}"
    )
    args.out.write_text(markdown(rows, args.seeds, command))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
