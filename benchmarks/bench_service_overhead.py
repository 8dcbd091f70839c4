"""The service's cost to training: ``alma run`` against ``alma simulate`` on the same stream.

Both front doors run the same engine on the same chunks, so their series are equal; what may
differ is time. The daemon runs ingest, a background publisher, status and metrics threads beside
the training thread, and those must not slow training down (docs/service.md, "Threads"). Each
repeat runs, as separate processes and one after the other:

1. ``alma simulate`` on the README's embedded example (MNIST, SM width 64, ``--megabatches``
   chunks);
2. ``alma run --embedded --replay mnist --until-chunks N`` on the same stream, with
   ``serving.kind`` = ``--serving`` (``local``: the embedded default; ``torchserve``: a TorchServe
   started here on free loopback ports, as ``alma serve`` starts it; ``none``: no publisher).

Reported per repeat, and as medians over the repeats: the training time (the sum of the stages'
``train_seconds``), the process wall time, and their ratios run / simulate (targets: training
<= 1.10, wall <= 1.20). The two series are checked to be equal, so both sides did the same work.

Run from the repository root::

    python benchmarks/bench_service_overhead.py                      # writes benchmarks/results/service_overhead.json
    python benchmarks/bench_service_overhead.py --serving torchserve --out benchmarks/results/service_overhead_torchserve.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Series fields that must agree for the two runs to have done the same work.
SAME_WORK = ("test_error", "prequential_error", "train_flops", "model_version")


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


def series(results: Path) -> list[dict]:
    return json.loads(results.read_text())["series"]


def training_seconds(rows: list[dict]) -> float:
    return sum(row.get("train_seconds") or 0.0 for row in rows)


def serving_overrides(kind: str, folder: Path) -> tuple[list[str], object | None]:
    """``--set`` overrides for the daemon, and the TorchServe process to stop afterwards (if any)."""
    if kind != "torchserve":
        return [f"serving.kind={kind}"], None
    from alma_daemon.config import build_config
    from alma_daemon.local_servers.processes import free_ports
    from alma_daemon.local_servers.torchserve import TorchServeServer

    inference, management, metrics = free_ports(3)
    serving = {
        "kind": "torchserve",
        "inference_url": f"http://127.0.0.1:{inference}",
        "management_url": f"http://127.0.0.1:{management}",
        "metrics_url": f"http://127.0.0.1:{metrics}",
    }
    config = build_config(
        {
            "daemon": {"state_dir": str(folder / "torchserve"), "checkpoint_dir": str(folder / "model_store")},
            "serving": serving,
        }
    )
    server = TorchServeServer.for_config(config)
    server.start()
    return [f"serving.{key}={value}" for key, value in serving.items()], server


def one_repeat(index: int, args: argparse.Namespace, folder: Path) -> dict:
    stream = [f"stream.megabatches={args.megabatches}", f"train.epochs={args.epochs}"]
    sim_out = folder / f"simulate-{index}"
    simulate = [sys.executable, "-m", "alma_daemon", "simulate", "--no-progress", "--out", str(sim_out)]
    for override in stream:
        simulate += ["--set", override]
    run_dir = folder / f"run-{index}"
    overrides, server = serving_overrides(args.serving, run_dir)
    daemon = [
        sys.executable,
        "-m",
        "alma_daemon",
        "run",
        "--embedded",
        "--replay",
        "mnist",
        "--no-progress",
        "--until-chunks",
        str(args.megabatches),
    ]
    for override in [
        *stream,
        f"daemon.state_dir={run_dir / 'state'}",
        f"daemon.checkpoint_dir={run_dir / 'model_store'}",
        *overrides,
    ]:
        daemon += ["--set", override]
    try:
        simulate_wall = timed(simulate)
        run_wall = timed(daemon)
    finally:
        if server is not None:
            server.stop()
    sim_rows, run_rows = series(sim_out / "results.json"), series(run_dir / "state" / "results.json")
    same = [{k: r.get(k) for k in SAME_WORK} for r in sim_rows] == [{k: r.get(k) for k in SAME_WORK} for r in run_rows]
    figures = {
        "simulate": {
            "train_seconds": training_seconds(sim_rows),
            "wall_seconds": simulate_wall,
            "stage_seconds": [r.get("train_seconds") for r in sim_rows],
        },
        "run": {
            "train_seconds": training_seconds(run_rows),
            "wall_seconds": run_wall,
            "stage_seconds": [r.get("train_seconds") for r in run_rows],
        },
        "same_series": same,
    }
    figures["train_ratio"] = figures["run"]["train_seconds"] / figures["simulate"]["train_seconds"]
    figures["wall_ratio"] = run_wall / simulate_wall
    print(
        f"repeat {index}: training {figures['simulate']['train_seconds']:.1f} s simulate, "
        f"{figures['run']['train_seconds']:.1f} s run ({figures['train_ratio']:.3f}x); wall "
        f"{simulate_wall:.1f} s vs {run_wall:.1f} s ({figures['wall_ratio']:.3f}x); same series: {same}",
        flush=True,
    )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabatches", type=int, default=10, help="chunks in the stream (README example: 10)")
    parser.add_argument("--epochs", type=int, default=100, help="train.epochs (README example: 100)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serving", choices=("local", "torchserve", "none"), default="local")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "service_overhead.json"))
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-service-"))
    try:
        repeats = [one_repeat(i, args, folder) for i in range(args.repeats)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {
        "benchmark": "service_overhead",
        "setting": {
            "megabatches": args.megabatches,
            "epochs": args.epochs,
            "serving": args.serving,
            "learner": "sm width 64 (config.yaml defaults)",
            "dataset": "mnist",
        },
        "train_ratio_median": statistics.median(r["train_ratio"] for r in repeats),
        "wall_ratio_median": statistics.median(r["wall_ratio"] for r in repeats),
        "all_series_equal": all(r["same_series"] for r in repeats),
        "repeats": repeats,
        "machine": {
            "cpus_usable": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_after": os.getloadavg(),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"training {result['train_ratio_median']:.3f}x, wall {result['wall_ratio_median']:.3f}x "
        f"(medians of {args.repeats}); series equal: {result['all_series_equal']}; written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
