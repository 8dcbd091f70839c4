"""Our training loop (Trainer.fit) against a minimal hand-written PyTorch loop.

Both do the same work on the same data in the same process: the same model and optimizer, the same
shuffled mini-batches, the same number of epochs, a validation pass after every epoch. The figure
is the speed ratio plain_seconds / ours_seconds (1.0 = as fast; target >= 0.9), median of repeats,
with the two loops interleaved so machine noise hits both alike.

    python benchmarks/bench_training.py [--repeats 5] [--epochs 10] [--out benchmarks/results/training.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from alma_daemon.config import TrainConfig
from alma_daemon.data.augment import flip_and_crop
from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK, load_dataset
from alma_daemon.data.streams import partition, split_chunk, Chunk
from alma_daemon.models.backbones import build_backbone
from alma_daemon.training.loop import EVAL_BATCH, Trainer
from alma_daemon.training.optim import build_optimizer

CASES = {
    # name: (dataset, task, width, examples in the chunk, optimizer)
    "mnist-mlp64": ("mnist", MNIST_TASK, 64, 6000, "adadelta"),
    "cifar-vgg8": ("cifar10", CIFAR10_TASK, 8, 1000, "sgd"),
}


def plain_loop(net, train, val, config: TrainConfig, optimizer_name: str, augment: bool, seed: int) -> None:
    """What a careful engineer writes by hand: no early stopping bookkeeping, no FLOP counting."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = build_optimizer(optimizer_name, net.parameters(), config)
    for _ in range(config.epochs):
        net.train()
        order = torch.randperm(len(train), generator=gen)
        for i in range(0, len(order), config.batch_size):
            index = order[i : i + config.batch_size]
            xb, yb = train.x[index], train.y[index]
            if augment:
                xb = flip_and_crop(xb, gen)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(xb), yb).backward()
            optimizer.step()
        net.eval()
        with torch.inference_mode():
            for i in range(0, len(val), EVAL_BATCH):
                net(val.x[i : i + EVAL_BATCH]).argmax(1)


def run_case(name: str, repeats: int, epochs: int) -> dict:
    dataset_name, task, width, examples, optimizer = CASES[name]
    dataset = load_dataset(dataset_name)
    chunk = Chunk(1, partition(dataset.train, 1, seed=0, limit=examples)[0])
    split = split_chunk(chunk, 0.1, seed=0)
    # patience = epochs: early stopping never cuts our loop short, so both run every epoch.
    config = TrainConfig(epochs=epochs, patience=epochs, batch_size=128)
    ours, plain = [], []
    for r in range(repeats):
        net = build_backbone(task, width)
        start = time.perf_counter()
        Trainer(config, optimizer, torch.device("cpu"), seed=r, augment=task.augment).fit(net, split.train, split.val)
        ours.append(time.perf_counter() - start)
        net = build_backbone(task, width)
        start = time.perf_counter()
        plain_loop(net, split.train, split.val, config, optimizer, task.augment, seed=r)
        plain.append(time.perf_counter() - start)
    ratio = statistics.median(p / o for p, o in zip(plain, ours))
    return {"case": name, "epochs": epochs, "train_examples": len(split.train), "repeats": repeats,
            "ours_seconds_median": statistics.median(ours), "plain_seconds_median": statistics.median(plain),
            "speed_ratio_median": ratio, "ours_seconds": ours, "plain_seconds": plain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--out", default="benchmarks/results/training.json")
    args = parser.parse_args()
    results = []
    for name in args.cases:
        result = run_case(name, args.repeats, args.epochs)
        print(f"{name}: ours {result['ours_seconds_median']:.2f} s, plain {result['plain_seconds_median']:.2f} s, "
              f"speed ratio {result['speed_ratio_median']:.3f}")
        results.append(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                               "threads": torch.get_num_threads(), "results": results}, indent=1))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
