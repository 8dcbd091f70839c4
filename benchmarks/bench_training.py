"""Our training loop (Trainer.fit) against a minimal hand-written PyTorch loop.

Both do the same work on the same data in the same process: the same model and optimizer
arithmetic, the same shuffled mini-batches (the same seeded generator), the same number of epochs,
a validation pass after every epoch. The hand-written loop is what a careful engineer writes with
PyTorch's defaults: ``torch.optim`` as constructed with no flags, the model's own input
normalization on every batch, ``.item()``-free. Both reach the same validation errors (checked,
``same_result``), so the ratio compares speed only. The figure is plain_seconds / ours_seconds
(1.0 = as fast; target >= 1.5), median of repeats, the two loops interleaved so machine noise hits
both alike. ``--compile`` adds our loop with ``train.compile`` (compile time excluded: reported
apart, first stage); its validation errors are listed beside the others', as compiled kernels
round differently. ``--profile`` adds, for one more run of each loop under ``torch.profiler``, the
seconds spent in each kind of op (convolutions, batch norms, ...; profiled runs are slower): where
the two loops run the same kernels, those bound the ratio.

    python benchmarks/bench_training.py [--repeats 5] [--epochs 10] [--compile] [--profile]
        [--device cuda] [--out benchmarks/results/training.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
import torch.nn.functional as F
from figures_file import write_figures  # this script's folder is on sys.path when it runs
from torch.profiler import ProfilerActivity, profile

from alma_daemon.config import TrainConfig
from alma_daemon.data.augment import flip_and_crop
from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK, load_dataset
from alma_daemon.data.streams import Chunk, partition, split_chunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.models.backbones import build_backbone
from alma_daemon.seeding import generator
from alma_daemon.training.loop import EVAL_BATCH, Trainer
from alma_daemon.training.optim import DEFAULT_LR, DEFAULT_WEIGHT_DECAY

CASES = {
    # name: (dataset, task, width, examples in the chunk, optimizer)
    "mnist-mlp64": ("mnist", MNIST_TASK, 64, 6000, "adadelta"),  # the README's main job, one stage
    "cifar-vgg8": ("cifar10", CIFAR10_TASK, 8, 1000, "sgd"),
    "cifar-vgg16": ("cifar10", CIFAR10_TASK, 16, 1000, "sgd"),  # examples/cifar-sm.yaml's width
}


#: The ops ``--profile`` reports, by kind (forward and backward kernels; CPU op names).
OP_KINDS = {
    "convolution": ("aten::mkldnn_convolution", "aten::convolution_backward"),
    "batch norm": ("aten::native_batch_norm", "aten::native_batch_norm_backward"),
    "max pool": ("aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward"),
    "relu": ("aten::relu", "aten::relu_", "aten::clamp_min", "aten::clamp_min_", "aten::threshold_backward"),
    "matmul": ("aten::mm", "aten::addmm"),
}


def hand_written_optimizer(name: str, params, config: TrainConfig) -> torch.optim.Optimizer:
    lr, wd = DEFAULT_LR[name], DEFAULT_WEIGHT_DECAY[name]
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, weight_decay=wd)
    return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)


def plain_loop(net, train, val, config: TrainConfig, optimizer_name: str, augment: bool, seed: int) -> float:
    """What a careful engineer writes by hand: no early stopping bookkeeping, no FLOP counting. Returns the best val error."""
    gen = generator(seed, "fit", "model")  # the generator Trainer.fit draws from: the same batches
    optimizer = hand_written_optimizer(optimizer_name, net.parameters(), config)
    errors = []
    for _ in range(config.epochs):
        net.train()
        for index in torch.randperm(len(train), generator=gen).to(train.x.device).split(config.batch_size):
            xb, yb = train.x[index], train.y[index]
            if augment:
                xb = flip_and_crop(xb, gen)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(xb), yb).backward()
            optimizer.step()
        net.eval()
        wrong = 0
        with torch.inference_mode():
            for i in range(0, len(val), EVAL_BATCH):
                wrong += (net(val.x[i : i + EVAL_BATCH]).argmax(1) != val.y[i : i + EVAL_BATCH]).sum()
        errors.append(int(wrong) / len(val))
    return min(errors)


def op_seconds(fn) -> dict[str, float]:
    """Self CPU seconds of each kind of op (``OP_KINDS``) in one run of ``fn``, and of all ops together."""
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        fn()
    events = profiler.key_averages()
    seconds = {kind: sum(e.self_cpu_time_total for e in events if e.key in ops) / 1e6 for kind, ops in OP_KINDS.items()}
    return {**seconds, "all ops": sum(e.self_cpu_time_total for e in events) / 1e6}


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def synchronized(fn, device: torch.device):
    """``fn`` followed by a wait for the device's queued work, so a timing covers it."""

    def run():
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return result

    return run


def run_case(
    name: str, repeats: int, epochs: int, with_compile: bool, with_profile: bool = False, device_name: str = "cpu"
) -> dict:
    dataset_name, task, width, examples, optimizer = CASES[name]
    dataset = load_dataset(dataset_name)
    chunk = Chunk(1, partition(dataset.train, 1, seed=0, limit=examples)[0])
    split = split_chunk(chunk, 0.1, seed=0)
    # patience = epochs: early stopping never cuts our loop short, so both run every epoch.
    config = TrainConfig(epochs=epochs, patience=epochs, batch_size=128)
    compiled_config = dataclasses.replace(config, compile=True)
    device = torch.device(device_name)

    def ours(cfg: TrainConfig, seed: int):
        torch.manual_seed(seed)
        net = build_backbone(task, width).to(device)
        return (
            Trainer(cfg, optimizer, device, seed=seed, augment=task.augment).fit(net, split.train, split.val).val_error
        )

    # The hand-written loop keeps the stage's examples on the device, as a careful engineer would.
    train, val = (LabeledData(d.x.to(device), d.y.to(device)) for d in (split.train, split.val))

    def plain(seed: int):
        torch.manual_seed(seed)
        net = build_backbone(task, width).to(device)
        return plain_loop(net, train, val, config, optimizer, task.augment, seed)

    result: dict = {"case": name, "epochs": epochs, "train_examples": len(split.train), "repeats": repeats}
    if with_compile:
        result["compile_first_stage_seconds"], _ = timed(lambda: ours(compiled_config, 0))
    loops = ["ours", "plain", *(["ours_compiled"] if with_compile else [])]
    times: dict[str, list[float]] = {loop: [] for loop in loops}
    errors: dict[str, list[float]] = {loop: [] for loop in loops}
    for r in range(repeats):
        for loop, run in (("ours", lambda: ours(config, r)), ("plain", lambda: plain(r))):
            seconds, error = timed(synchronized(run, device))
            times[loop].append(seconds)
            errors[loop].append(error)
        if with_compile:
            seconds, error = timed(synchronized(lambda: ours(compiled_config, r), device))
            times["ours_compiled"].append(seconds)
            errors["ours_compiled"].append(error)
    result["same_result"] = errors["ours"] == errors["plain"]
    # Compiled kernels round differently: their errors are close to the plain loop's, not equal.
    result["best_val_errors"] = errors
    for key, values in times.items():
        result[f"{key}_seconds_median"] = statistics.median(values)
        result[f"{key}_seconds"] = values
    result["speed_ratio_median"] = statistics.median(p / o for p, o in zip(times["plain"], times["ours"]))
    if with_compile:
        result["compiled_speed_ratio_median"] = statistics.median(
            p / o for p, o in zip(times["plain"], times["ours_compiled"])
        )
    if with_profile:
        result["profiled_op_seconds"] = {
            "ours": op_seconds(lambda: ours(config, 0)),
            "plain": op_seconds(lambda: plain(0)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--compile", action="store_true", help="also time our loop with train.compile")
    parser.add_argument("--profile", action="store_true", help="also profile one run of each loop by kind of op")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--out", default=None, help="default benchmarks/results/training.json (training-DEVICE.json off the CPU)"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = []
    for name in args.cases:
        result = run_case(name, args.repeats, args.epochs, args.compile, args.profile, args.device)
        errors = {loop: statistics.mean(values) for loop, values in result["best_val_errors"].items()}
        extra = (
            f", compiled ratio {result['compiled_speed_ratio_median']:.3f} (mean best validation error "
            f"{errors['ours_compiled']:.4f}, plain {errors['plain']:.4f})"
            if args.compile
            else ""
        )
        print(
            f"{name}: ours {result['ours_seconds_median']:.2f} s, plain {result['plain_seconds_median']:.2f} s, "
            f"speed ratio {result['speed_ratio_median']:.3f}{extra}, same result {result['same_result']}"
        )
        for loop, seconds in result.get("profiled_op_seconds", {}).items():
            print(f"  {loop}, profiled: " + ", ".join(f"{kind} {s:.2f} s" for kind, s in seconds.items() if s))
        results.append(result)
    device = torch.device(args.device)
    out = args.out or f"benchmarks/results/training{'' if device.type == 'cpu' else '-' + device.type}.json"
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    write_figures(out, {"device": args.device, "results": results}, load_before, machine)


if __name__ == "__main__":
    main()
