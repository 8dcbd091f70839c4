"""An Ens stage with 5 members against a 1-member stage (issue 14: at most 2.5x, it was 3.3x).

The README's main job's stage (MNIST, one chunk of 6,000 examples, MLPs of width 64) trained by the
``ens`` learner with ``learner.members`` = 5 and = 1, the same epochs for every member (patience =
epochs, so no member stops early and the work is exactly 5x). ``stacked`` is the learner as it is
(members trained together as one batched model, :mod:`alma_daemon.training.members`); ``one by one``
is the same learner with stacking turned off, as it trained before. Runs are interleaved so machine
noise hits all alike; the figure is the median ratio of the 5-member stage to the 1-member stage.

    python benchmarks/bench_members.py [--repeats 5] [--epochs 10] [--members 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import TrainConfig, learner_config
from alma_daemon.data.datasets import MNIST_TASK, load_dataset
from alma_daemon.data.streams import Chunk, partition, split_chunk
from alma_daemon.learners import build_learner, ens
from alma_daemon.training.loop import Trainer


def stage_seconds(members: int, stacked: bool, split, config: TrainConfig, seed: int, device: torch.device) -> float:
    learner = build_learner("ens", MNIST_TASK, learner_config(name="ens", width=64, members=members), seed).to(device)
    trainer = Trainer(config, "adadelta", device, seed=seed)
    original = ens.stacked_fitter
    if not stacked:
        ens.stacked_fitter = lambda *args: lambda members: None
    try:
        start = time.perf_counter()
        learner.fit(split.train, split.val, trainer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start
    finally:
        ens.stacked_fitter = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=None, help="default benchmarks/results/members.json (members-DEVICE.json off the CPU)"
    )
    args = parser.parse_args()
    dataset = load_dataset("mnist")
    split = split_chunk(Chunk(1, partition(dataset.train, 1, seed=0, limit=6000)[0]), 0.1, seed=0)
    config = TrainConfig(epochs=args.epochs, patience=args.epochs, batch_size=128)
    load_before = os.getloadavg()
    runs = {"one": [], "stacked": [], "one_by_one": []}
    device = torch.device(args.device)
    stage_seconds(1, True, split, config, 0, device)  # warm-up: imports, allocator, kernels
    for r in range(args.repeats):
        runs["one"].append(stage_seconds(1, True, split, config, r, device))
        runs["stacked"].append(stage_seconds(args.members, True, split, config, r, device))
        runs["one_by_one"].append(stage_seconds(args.members, False, split, config, r, device))
    ratios = {k: statistics.median(t / o for t, o in zip(runs[k], runs["one"])) for k in ("stacked", "one_by_one")}
    print(
        f"{args.members} members / 1 member: stacked {ratios['stacked']:.2f}x, one by one {ratios['one_by_one']:.2f}x "
        f"(1 member: {statistics.median(runs['one']):.2f} s)"
    )
    out = Path(args.out or f"benchmarks/results/members{'' if device.type == 'cpu' else '-' + device.type}.json")
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    write_figures(
        out,
        {
            "members": args.members,
            "epochs": args.epochs,
            "train_examples": len(split.train),
            "ratio_stacked_median": ratios["stacked"],
            "ratio_one_by_one_median": ratios["one_by_one"],
            "seconds": runs,
        },
        load_before,
        machine,
    )


if __name__ == "__main__":
    main()
