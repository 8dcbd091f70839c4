"""Why a thread beside training slowed it down: the training thread's sleeps per step.

A training thread runs MLP steps (MNIST shapes, width 64, batch 128) while a second thread that once
ran a torch op stays alive, as the daemon's publisher does. Three cases, each in a fresh process:

- ``none``: no second thread;
- ``plain``: the second thread ran its op as the publisher used to (torch's defaults);
- ``beside``: the second thread called ``runtime.run_beside_training()`` first.

Reported per case: the training thread's voluntary context switches per step (from
``/proc/self/task/<tid>/status``: each is a sleep in the kernel, here a futex wait of libgomp, since
the step itself never blocks) and milliseconds per step. The switch count does not depend on what
else the machine runs; the times do, so read them from an idle machine.

    python benchmarks/bench_thread_contention.py     # writes benchmarks/results/thread_contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

CASES = ("none", "plain", "beside")


def sleeps_of_this_thread() -> int:
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise RuntimeError("no voluntary_ctxt_switches in /proc (Linux only)")


def one_case(case: str, steps: int) -> dict:
    """Runs in its own process: libgomp's teams live as long as the process."""
    import torch

    from alma_daemon.runtime import run_beside_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    x, y = torch.randn(6016, 784), torch.randint(0, 10, (6016,))

    def train(count: int) -> None:
        for i in range(count):
            batch = slice((i * 128) % 5888, (i * 128) % 5888 + 128)
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    hold = threading.Event()

    def beside() -> None:
        if case == "beside":
            run_beside_training()
        with torch.no_grad():  # what the publisher's guard does: a model evaluated once
            torch.nn.Linear(784, 64)(torch.randn(512, 784)).softmax(1)
        hold.wait()

    train(50)
    if case != "none":
        threading.Thread(target=beside, daemon=True).start()
        time.sleep(0.5)
    sleeps, start = sleeps_of_this_thread(), time.perf_counter()
    train(steps)
    seconds = time.perf_counter() - start
    hold.set()
    return {
        "sleeps_per_step": (sleeps_of_this_thread() - sleeps) / steps,
        "ms_per_step": 1000 * seconds / steps,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "thread_contention.json"))
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.steps)))
        return 0
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for _ in range(args.repeats):
        for case in CASES:  # interleaved, so a change in the machine's load hits every case alike
            done = subprocess.run(
                [sys.executable, __file__, "--case", case, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            runs[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary = {
        case: {key: statistics.median(r[key] for r in results) for key in ("sleeps_per_step", "ms_per_step")}
        for case, results in runs.items()
    }
    for case, figures in summary.items():
        print(f"{case:>7}: {figures['sleeps_per_step']:.1f} sleeps per step, {figures['ms_per_step']:.2f} ms per step")
    result = {
        "benchmark": "thread_contention",
        "steps": args.steps,
        "median": summary,
        "runs": runs,
        "machine": {
            "cpus_usable": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "load_average_after": os.getloadavg(),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
