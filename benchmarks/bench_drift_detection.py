"""Small drifts: how soon each ``policy.drift_detector`` of the adaptive policy sees them, and how often
it cries wolf (issue 37, item 3).

Each drift kind runs on MNIST with SM width 64, ``--chunks`` chunks of the size B = 500 gives (120
examples; ``stream.train_examples`` limits the stream), drifting at ``--at``; the stationary stream
does not drift and runs ``--stationary-chunks`` chunks of the same size. Every (kind, detector, seed) is one simulated stream with the adaptive policy, so a
detection changes what the policy does afterwards, as it would in service. From each run:

- the detection delay: the chunks read from ``--at`` to the first drift alarm at or after it, counting
  both (1 = seen on the first drifted chunk; a gradual drift counts from the start of its ramp);
- false alarms: alarms before ``--at``, and on the stationary stream all alarms, as a rate per 500
  chunks over every undrifted chunk of every run;
- the rise the drift caused: the mean prequential error of the 10 chunks from the full drift on,
  less that of the 10 chunks before ``--at``, on the ``threshold`` run (which does not see it).

``--cer`` also runs issue 37's target setting, the 10-degree rotation at chunk 250 of 400 (MNIST B =
400, SM 64), for the fixed and geometric schedules and each detector, and reports the CERs.

    nice python benchmarks/bench_drift_detection.py --seeds 0 1 --jobs 2
    nice python benchmarks/bench_drift_detection.py --seeds 0 --cer-only --jobs 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.research.run_pool import PoolRun, resume, run_each

RESULTS = Path(__file__).resolve().parent / "results" / "drift_detection.json"
DETECTORS = ["threshold", "page_hinkley", "adwin"]
#: Chunk size of MNIST's 60,000 training examples in B = 500 mega-batches.
CHUNK_EXAMPLES = 120
#: Chunks of error averaged before and after a drift to measure its rise.
RISE_WINDOW = 10
GRADUAL_CHUNKS = 20

#: kind -> (stream.drift overrides, what it is); None: the stationary stream.
KINDS: dict[str, tuple[dict | None, str]] = {
    "stationary": (None, "no drift"),
    "rotate-10": ({"kind": "rotate", "degrees": 10.0}, "images rotated 10 degrees, abrupt"),
    "prior-shift": ({"kind": "prior_shift", "strength": 0.9}, "half of the classes 90 % rarer, abrupt"),
    "rotate-10-gradual": (
        {"kind": "rotate", "degrees": 10.0, "over": GRADUAL_CHUNKS},
        f"images rotated 10 degrees, ramped over {GRADUAL_CHUNKS} chunks",
    ),
}
#: Issue 37's target: the fixed waits and geometric ratios of bench_policy.py's grid for B = 400.
CER_WAITS = [1, 2, 5, 10, 25]
CER_RATIOS = [0.25, 0.5, 1.0, 2.0]


def simulate(values: dict) -> dict:
    """One simulated stream (one torch thread, so the series repeats bit for bit): its results."""
    from alma_daemon.config import build_config
    from alma_daemon.research.run_pool import simulate_on_one_thread

    return simulate_on_one_thread(build_config({}, [f"{key}={json.dumps(value)}" for key, value in values.items()]))


def detection_run(kind: str, detector: str, seed: int, chunks: int, at: int) -> dict:
    values = {
        "learner.name": "sm",
        "learner.width": 64,
        "stream.megabatches": chunks,
        "stream.train_examples": chunks * CHUNK_EXAMPLES,
        "policy.name": "adaptive",
        "policy.drift_detector": detector,
        "seed": seed,
        "stream.seed": seed,
    }
    drift = KINDS[kind][0]
    if drift is not None:
        values.update({f"stream.drift.{key}": value for key, value in drift.items()} | {"stream.drift.at": at})
    start = time.perf_counter()
    series = simulate(values)["series"]
    return {
        "kind": kind,
        "detector": detector,
        "seed": seed,
        "chunks": chunks,
        "alarms": [r["t"] for r in series if r["trained"] and r["reason"].startswith("drift")],
        "prequential_error": [round(r["prequential_error"], 4) for r in series],
        "seconds": round(time.perf_counter() - start, 1),
    }


def cer_run(policy: dict, seed: int) -> dict:
    values = {
        "learner.name": "sm",
        "learner.width": 64,
        "stream.megabatches": 400,
        "stream.drift.kind": "rotate",
        "stream.drift.degrees": 10.0,
        "stream.drift.at": 250,
        **policy,
        "seed": seed,
        "stream.seed": seed,
    }
    start = time.perf_counter()
    summary = simulate(values)["summary"]
    return {
        "policy": policy,
        "seed": seed,
        "cer": summary["cer"],
        "cumulative_train_flops": summary["cumulative_train_flops"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def summarize(runs: list[dict], at: int) -> dict:
    """Per (kind, detector): detection delays, false alarms, and the rise each drift caused."""
    table: dict = {}
    for kind, (drift, description) in KINDS.items():
        over = (drift or {}).get("over", 1)
        for detector in DETECTORS:
            mine = [r for r in runs if r["kind"] == kind and r["detector"] == detector]
            if not mine:
                continue
            row: dict = {"description": description, "seeds": sorted(r["seed"] for r in mine)}
            if drift is None:
                alarms = sum(len(r["alarms"]) for r in mine)
                row["false_alarms"] = alarms
                row["chunks"] = sum(r["chunks"] for r in mine)
                row["false_alarms_per_500_chunks"] = 500 * alarms / row["chunks"]
            else:
                delays = [next((t - at + 1 for t in r["alarms"] if t >= at), None) for r in mine]
                row["delays"] = delays
                row["detected_within_10"] = sum(d is not None and d <= 10 for d in delays)
                row["false_alarms_before_at"] = sum(sum(t < at for t in r["alarms"]) for r in mine)
                if detector == "threshold":
                    rises = []
                    for r in mine:
                        errors = r["prequential_error"]
                        full = at + over - 1
                        rises.append(
                            statistics.fmean(errors[full - 1 : full - 1 + RISE_WINDOW])
                            - statistics.fmean(errors[at - 1 - RISE_WINDOW : at - 1])
                        )
                    row["error_rise"] = rises
            table.setdefault(kind, {})[detector] = row
    return table


def false_alarm_rate(runs: list[dict], at: int) -> dict:
    """False alarms per 500 undrifted chunks: the stationary streams and every drifting stream before ``at``."""
    rates = {}
    for detector in DETECTORS:
        mine = [r for r in runs if r["detector"] == detector]
        undrifted = sum(r["chunks"] if r["kind"] == "stationary" else at - 1 for r in mine)
        alarms = sum(sum(t < at or r["kind"] == "stationary" for t in r["alarms"]) for r in mine)
        rates[detector] = {"alarms": alarms, "chunks": undrifted, "per_500_chunks": 500 * alarms / max(1, undrifted)}
    return rates


def markdown(report: dict) -> str:
    lines = [
        "| drift | detector | delay (chunks, per seed) | within 10 | false alarms before the drift | error rise (points) |",
        "|---|---|---|---|---|---|",
    ]
    for kind, rows in report["detection"].items():
        for detector, row in rows.items():
            if kind == "stationary":
                lines.append(f"| {kind} | {detector} | - | - | {row['false_alarms']} in {row['chunks']} chunks | - |")
                continue
            delays = ", ".join("none" if d is None else str(d) for d in row["delays"])
            rise = rows["threshold"].get("error_rise") if "threshold" in rows else None
            rise_text = ", ".join(f"{100 * x:.1f}" for x in rise) if rise else "-"
            lines.append(
                f"| {kind} | {detector} | {delays} | {row['detected_within_10']}/{len(row['delays'])} | "
                f"{row['false_alarms_before_at']} | {rise_text} |"
            )
    lines.append("")
    lines.append("| detector | false alarms | undrifted chunks | per 500 chunks |")
    lines.append("|---|---|---|---|")
    for detector, rate in report["false_alarm_rate"].items():
        lines.append(f"| {detector} | {rate['alarms']} | {rate['chunks']} | {rate['per_500_chunks']:.2f} |")
    if report.get("cer"):
        lines.append("")
        lines.append("| policy (rotate 10 degrees at chunk 250 of 400) | CER | training FLOPs |")
        lines.append("|---|---|---|")
        for label, row in report["cer"].items():
            lines.append(f"| {label} | {row['cer']:.4f} | {row['cumulative_train_flops']:.3g} |")
    return "\n".join(lines)


def cer_label(policy: dict) -> str:
    if policy["policy.name"] == "fixed":
        return f"fixed w={policy['policy.wait']}"
    if policy["policy.name"] == "geometric":
        return f"geometric {policy['policy.ratio']:g}"
    return f"adaptive, {policy['policy.drift_detector']}"


def cer_summary(cer_runs: list[dict]) -> dict:
    """Mean CER and FLOPs per policy over the seeds run."""
    policies = {json.dumps(r["policy"], sort_keys=True): r["policy"] for r in cer_runs}
    return {
        cer_label(policy): {
            "seeds": sorted(r["seed"] for r in cer_runs if r["policy"] == policy),
            "cer": statistics.fmean(r["cer"] for r in cer_runs if r["policy"] == policy),
            "cumulative_train_flops": statistics.fmean(
                r["cumulative_train_flops"] for r in cer_runs if r["policy"] == policy
            ),
        }
        for policy in policies.values()
    }


def write(report: dict, runs: list[dict], cer_runs: list[dict], path: Path) -> None:
    """The report from the runs done so far (rewritten after each, so an interrupted benchmark resumes)."""
    if runs:
        report["detection"] = summarize(runs, report["at"])
        report["false_alarm_rate"] = false_alarm_rate(runs, report["at"])
    report["runs"] = runs
    if cer_runs:
        report["cer"] = cer_summary(cer_runs)
    report["cer_runs"] = cer_runs
    report["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    write_json_atomic(path, report)


def detection_key(kind: str, detector: str, seed: int) -> str:
    return json.dumps({"kind": kind, "detector": detector, "seed": seed})


def cer_key(policy: dict, seed: int) -> str:
    return json.dumps({"policy": policy, "seed": seed}, sort_keys=True)


class ReportRuns:
    """The run pool's cache for this benchmark: the runs kept in its report, rewritten after each."""

    def __init__(self, report: dict, path: Path):
        self.report, self.path = report, path
        self.runs: list[dict] = report.get("runs", [])
        self.cer_runs: list[dict] = report.get("cer_runs", [])
        self.by_key = {detection_key(r["kind"], r["detector"], r["seed"]): r for r in self.runs}
        self.by_key |= {cer_key(r["policy"], r["seed"]): r for r in self.cer_runs}

    def get(self, key: str) -> Any | None:
        return self.by_key.get(key)

    def put(self, key: str, record: Any) -> None:
        self.by_key[key] = record
        (self.cer_runs if "policy" in record else self.runs).append(record)
        self.save()

    def save(self) -> None:
        write(self.report, self.runs, self.cer_runs, self.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--at", type=int, default=100)
    parser.add_argument(
        "--stationary-chunks", type=int, default=500, help="the stationary stream's length (B = 500: all of MNIST)"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cer", action="store_true", help="also run the CER target setting (B = 400)")
    parser.add_argument("--cer-only", action="store_true", help="run the CER target only; keep the detection table")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    settings = {
        "chunks": args.chunks,
        "at": args.at,
        "stationary_chunks": args.stationary_chunks,
        "chunk_examples": CHUNK_EXAMPLES,
    }
    if any(report.get(key) != value for key, value in settings.items()):
        report = dict(settings)  # runs of other settings do not mix
    cache = ReportRuns(report, args.out)
    runs = []
    if not args.cer_only:
        runs += [
            PoolRun(
                detection_key(kind, detector, seed),
                detection_run,
                (kind, detector, seed, args.stationary_chunks if kind == "stationary" else args.chunks, args.at),
            )
            for kind in KINDS
            for detector in DETECTORS
            for seed in args.seeds
        ]
    if args.cer or args.cer_only:
        policies = [{"policy.name": "fixed", "policy.wait": w} for w in CER_WAITS]
        policies += [{"policy.name": "geometric", "policy.ratio": r} for r in CER_RATIOS]
        policies += [{"policy.name": "adaptive", "policy.drift_detector": d} for d in DETECTORS]
        runs += [PoolRun(cer_key(policy, seed), cer_run, (policy, seed)) for seed in args.seeds for policy in policies]
    _, todo = resume(runs, cache)
    run_each(todo, cache, jobs=args.jobs, on_done=lambda run, record: None, on_failed=_say_failed)
    cache.save()
    print(markdown(report))


def _say_failed(run: PoolRun, exc: Exception) -> None:
    print(f"FAILED {run.key}: {exc!r}")


if __name__ == "__main__":
    main()
