"""CPU data-parallel speed (issue 14, item 4): one process with T threads vs T torchrun ranks of one thread each.

For each T in ``--cores``, ``alma simulate`` of one config (default ``examples/mnist-sm.yaml``, on the CPU)
runs twice on the same T cores (``taskset -c 0..T-1``): once as one process with ``OMP_NUM_THREADS=T``, once
as ``torchrun --standalone --nproc_per_node T`` with ``OMP_NUM_THREADS=1`` (DistributedDataParallel on
gloo; docs/scaling.md). The cases alternate, so a drift in the machine's speed hits both alike. Each run
records the command's wall seconds (torchrun's start-up and the data loading included), the engine's wall
seconds and training seconds from ``results.json`` (training seconds are summed over the ranks there,
the compute of the whole stage; ``train_seconds_per_rank`` divides them back), the CER and the final error.
Needs T free cores for the largest T: on a shared machine the ranks compete with other jobs.

    python benchmarks/bench_data_parallel.py [--config FILE] [--cores 2 4] [--repeats 1] [--out FILE]

Figures go to ``benchmarks/results/data_parallel_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures_file import write_figures

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def simulate_command(config: Path, out: Path, ranks: int, overrides: list[str]) -> list[str]:
    launcher = [sys.executable, "-m", "alma_daemon"]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        launcher += ["-m", "alma_daemon"]
    sets = [arg for key in ["device=cpu", *overrides] for arg in ("--set", key)]
    return [*launcher, "simulate", "--config", str(config), "--out", str(out), "--no-progress", *sets]


def run_case(config: Path, cores: int, ranks: int, overrides: list[str], scratch: Path) -> dict:
    threads = cores // ranks
    out = scratch / f"cores{cores}-ranks{ranks}-{time.monotonic_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ""}
    command = ["taskset", "-c", f"0-{cores - 1}", *simulate_command(config, out, ranks, overrides)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    summary = json.loads((out / "results.json").read_text())["summary"]
    result = {
        "cores": cores,
        "ranks": ranks,
        "threads_per_rank": threads,
        "command_wall_seconds": wall,
        "engine_wall_seconds": summary["wall_seconds"],
        "train_seconds_summed_over_ranks": summary["train_seconds"],
        "train_seconds_per_rank": summary["train_seconds"] / ranks,
        "stages": summary["stages"],
        "cer": summary.get("cer"),
        "final_test_error": summary.get("final_test_error"),
    }
    print(
        f"{cores} cores, {ranks} rank(s) x {threads} thread(s): wall {wall:.1f} s, engine {summary['wall_seconds']:.1f} s, "
        f"training per rank {result['train_seconds_per_rank']:.1f} s, CER {result['cer']:.4f}, "
        f"final error {result['final_test_error']:.4f}",
        flush=True,
    )
    return result


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "mnist-sm.yaml")
    parser.add_argument("--cores", type=int, nargs="*", default=[2, 4], help="core counts to compare on")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case, alternating")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override (repeatable)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "data_parallel_cpu.json"))
    args = parser.parse_args()
    if shutil.which("taskset") is None:
        parser.error("taskset (util-linux) is needed to pin each case to its cores")
    if min(args.cores) < 2:
        parser.error("--cores: each count must be at least 2 (one process against as many ranks as cores)")
    if max(args.cores) > (os.cpu_count() or 1):
        parser.error(f"--cores {max(args.cores)} exceeds this machine's {os.cpu_count()} cores")
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="alma-dp-") as scratch:
        for _ in range(args.repeats):
            for cores in args.cores:
                for ranks in (1, cores):
                    runs.append(run_case(args.config, cores, ranks, args.overrides, Path(scratch)))
    comparisons = []
    for cores in args.cores:
        alone = [r for r in runs if r["cores"] == cores and r["ranks"] == 1]
        ranked = [r for r in runs if r["cores"] == cores and r["ranks"] == cores]
        comparisons.append(
            {
                "cores": cores,
                "command_wall_speedup_median": median([r["command_wall_seconds"] for r in alone])
                / median([r["command_wall_seconds"] for r in ranked]),
                "train_seconds_speedup_median": median([r["train_seconds_per_rank"] for r in alone])
                / median([r["train_seconds_per_rank"] for r in ranked]),
            }
        )
        print(
            f"{cores} cores: ranks vs one process, wall x{comparisons[-1]['command_wall_speedup_median']:.2f}, "
            f"training x{comparisons[-1]['train_seconds_speedup_median']:.2f}"
        )
    results = {
        "config": str(args.config.resolve().relative_to(REPO))
        if args.config.resolve().is_relative_to(REPO)
        else str(args.config),
        "overrides": args.overrides,
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "speedups": comparisons,
    }
    write_figures(args.out, results, load_before, machine=cpu_model())


if __name__ == "__main__":
    main()
