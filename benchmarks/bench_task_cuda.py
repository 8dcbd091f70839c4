"""A team's tasks on a GPU (issue 42): the task's measure, class weights and a regression's loss, on CUDA.

Four streams through ``alma simulate``'s engine, each on the GPU and on the CPU of the same machine:

- ``fraud``: examples/table/fraud.yaml, a team's 40,000 transactions (2 % fraud) judged by the cost of
  its mistakes, trained with class weights (its table is written by examples/table/make_transactions.py);
- ``fraud-rare``: examples/table/fraud-rare.yaml, the rare-fraud history with a changing rule (0.7 % fraud),
  whose stages also train a linear candidate and calibrate the decision;
- ``regression``: a Friedman #1 table (10 uniform features, 5 of them relevant, unit noise), written by
  this script with numpy so that River need not be installed, judged by the mean squared error;
- ``mnist-sm``: the README's main job (the paper's error rate), whose series must not have changed.

For each it records the summary (the measure, its cumulative sum, the final test measure and the task's
other measures) and the wall time. The GPU's and the CPU's figures differ in their last digits (other
kernels), not in what the measure says; the point is that every new path (measures, weighted losses,
standardized targets, the guard's outputs) runs on CUDA tensors.

    python benchmarks/bench_task_cuda.py [--streams fraud regression mnist-sm] [--devices cuda cpu] [--out FILE]

Figures go to ``benchmarks/results/task_cuda.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from alma_daemon.config import load_config
from alma_daemon.research.simulate import run_simulation

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def friedman_table(path: Path, rows: int = 20_000, seed: int = 0) -> Path:
    """Friedman #1: y = 10 sin(pi x0 x1) + 20 (x2 - 1/2)^2 + 10 x3 + 5 x4 + noise, 10 uniform features."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(rows, 10))
    y = 10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
    y += rng.normal(size=rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(f"x{i}" for i in range(10)), "y"])
        writer.writerows([*row, target] for row, target in zip(x.tolist(), y.tolist(), strict=True))
    return path


def stream_configs(data: Path) -> dict[str, tuple[str | None, list[str]]]:
    """The streams by name: (config file, overrides)."""
    transactions = data / "transactions.csv"
    if not transactions.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "examples/table/make_transactions.py"), str(transactions)], check=True
        )
    rare = data / "transactions-rare.csv"
    if not rare.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "examples/table/make_transactions.py"), "--rare", str(rare)], check=True
        )
    regression = friedman_table(data / "friedman.csv")
    return {
        "fraud": ("examples/table/fraud.yaml", [f"dataset.files={transactions}"]),
        "fraud-rare": ("examples/table/fraud-rare.yaml", [f"dataset.files={rare}"]),
        "regression": (
            None,
            [
                "dataset.name=table",
                f"dataset.files={regression}",
                "dataset.label_column=y",
                "task.kind=regression",
                "task.measure=mse",
                "stream.megabatches=20",
                "policy.name=adaptive",
            ],
        ),
        "mnist-sm": ("examples/mnist-sm.yaml", []),
    }


def run(name: str, path: str | None, overrides: list[str], device: str) -> dict:
    config = load_config(str(ROOT / path) if path else None, [*overrides, f"device={device}"])
    start = time.perf_counter()
    results = run_simulation(config, progress=False)
    wall = time.perf_counter() - start
    summary = results["summary"]
    keep = ("measure", "cer", "final_test_error", "stages", "cumulative_train_flops")
    shown = {k: v for k, v in summary.items() if k in keep or k.startswith(("cumulative_", "final_test", "baseline"))}
    return {"stream": name, "device": device, "wall_seconds": round(wall, 2), **shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", nargs="+", default=["fraud", "fraud-rare", "regression", "mnist-sm"])
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--data", default=str(ROOT / "runs" / "data"), help="where the generated tables are written")
    parser.add_argument("--out", default=str(RESULTS / "task_cuda.json"))
    args = parser.parse_args()
    streams = stream_configs(Path(args.data))
    rows = []
    for name in args.streams:
        path, overrides = streams[name]
        for device in args.devices:
            rows.append(run(name, path, overrides, device))
            print(json.dumps(rows[-1]), flush=True)
    report = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "runs": rows,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
