"""An Ens stage with 5 members against a 1-member stage (issue 14: at most 2.5x, it was 3.3x).

The README's main job's stage (MNIST, one chunk of 6,000 examples, MLPs of width 64) trained by the
``ens`` learner with ``learner.members`` = 5 and = 1, the same epochs for every member (patience =
epochs, so no member stops early and the work is exactly 5x). ``stacked`` is the learner as it is
(members trained together as one batched model, :mod:`alma_daemon.training.members`); ``one by one``
is the same learner with stacking turned off, as it trained before. ``bound`` is what stacking can
give on the machine at best: a hand-written stacked loop doing the same optimizer steps with the
fewest kernels (autograd's batched backward, which is not bit-exact per member, one flat AdaDelta,
no validation), 5 members against 1. Runs are interleaved so machine noise hits all alike; the
figures are median ratios of the 5-member stage to the 1-member stage.

``vgg`` asks whether convolutional members would gain from the same idea: SGD steps of 5 reduced
VGG19-BN members (CIFAR-shaped batches of 128) one after another, and as one network whose
convolutions are grouped by member (``groups=5``), each against one member's steps.

    python benchmarks/bench_members.py [--repeats 5] [--epochs 10] [--members 5] [--vgg-widths 4 8 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import TrainConfig, learner_config
from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK, load_dataset
from alma_daemon.data.streams import Chunk, partition, split_chunk
from alma_daemon.learners import build_learner, ens
from alma_daemon.models.backbones import VGG19_BLOCKS, vgg_layers
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


def hand_stacked_seconds(members: int, split, config: TrainConfig, seed: int, device: torch.device) -> float:
    """The stage's optimizer steps for ``members`` stacked MLPs of width 64, hand-written with the fewest kernels."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = split.train.x.to(device).flatten(1).float().div(255)
    y = split.train.y.to(device)
    shapes = [(members, 64, x.shape[1]), (members, 64, 64), (members, 10, 64)]
    weights = [torch.randn(shape, generator=g).mul_(0.05) for shape in shapes]
    biases = [torch.zeros(shape[:2]) for shape in shapes]
    flat = torch.cat([t.reshape(-1) for t in weights + biases]).to(device)
    leaves, offset = [], 0
    for t in weights + biases:
        leaves.append(flat[offset : offset + t.numel()].view(t.shape).requires_grad_())
        offset += t.numel()
    square_avg, acc_delta, std, delta = (torch.zeros_like(flat) for _ in range(4))
    start = time.perf_counter()
    for _ in range(config.epochs):
        orders = torch.stack([torch.randperm(len(y), generator=g) for _ in range(members)]).to(device)
        for i in range(0, len(y), config.batch_size):
            index = orders[:, i : i + config.batch_size]
            z = x[index.reshape(-1)].view(*index.shape, -1)
            for layer, (weight, bias) in enumerate(zip(leaves[:3], leaves[3:])):
                z = torch.baddbmm(bias.unsqueeze(1), z, weight.transpose(1, 2))
                z = torch.relu(z) if layer < 2 else z
            loss = (
                F.cross_entropy(z.flatten(0, 1), y[index].flatten(), reduction="none").view(index.shape).mean(1).sum()
            )
            grads = torch.autograd.grad(loss, leaves)
            with torch.no_grad():
                grad = torch.cat([t.reshape(-1) for t in grads])
                square_avg.mul_(0.9).addcmul_(grad, grad, value=0.1)
                torch.add(square_avg, 1e-6, out=std).sqrt_()
                torch.add(acc_delta, 1e-6, out=delta).sqrt_()
                delta.div_(std).mul_(grad)
                acc_delta.mul_(0.9).addcmul_(delta, delta, value=0.1)
                flat.add_(delta, alpha=-1.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def grouped_vgg(width: int, members: int) -> torch.nn.Sequential:
    """``members`` reduced VGG19-BNs as one network: member m owns channel group m of every layer."""
    channels, layers = 3 * members, []
    for convs in VGG19_BLOCKS:
        for _ in range(convs):
            conv = torch.nn.Conv2d(channels, width * members, 3, padding=1, bias=False, groups=members)
            layers += [conv, torch.nn.BatchNorm2d(width * members), torch.nn.ReLU(inplace=True)]
            channels = width * members
        layers.append(torch.nn.MaxPool2d(2))
    return torch.nn.Sequential(*layers, torch.nn.Flatten(2), torch.nn.Conv1d(channels, 10 * members, 1, groups=members))


def vgg_steps_seconds(width: int, members: int, grouped: bool, steps: int, device: torch.device) -> float:
    """``steps`` SGD steps of ``members`` VGG members of ``width``: one after another or grouped."""
    if grouped:
        nets = [grouped_vgg(width, members).to(device)]
        x = torch.randn(128, 3 * members, 32, 32, device=device)
    else:
        nets = [torch.nn.Sequential(*vgg_layers(CIFAR10_TASK, width)).to(device) for _ in range(members)]
        x = torch.randn(128, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (128 * (members if grouped else 1),), device=device)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9) for net in nets]
    start = time.perf_counter()
    for _ in range(steps):
        for net, optimizer in zip(nets, optimizers):
            optimizer.zero_grad()
            logits = net(x).reshape(len(y), 10) if grouped else net(x)
            F.cross_entropy(logits, y).backward()
            optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vgg-widths", type=int, nargs="*", default=[4, 8, 16], help="none: skip the VGG part")
    parser.add_argument("--vgg-steps", type=int, default=10)
    parser.add_argument(
        "--out", default=None, help="default benchmarks/results/members.json (members-DEVICE.json off the CPU)"
    )
    args = parser.parse_args()
    dataset = load_dataset("mnist")
    split = split_chunk(Chunk(1, partition(dataset.train, 1, seed=0, limit=6000)[0]), 0.1, seed=0)
    config = TrainConfig(epochs=args.epochs, patience=args.epochs, batch_size=128)
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {"one": [], "stacked": [], "one_by_one": [], "hand_one": [], "hand_stacked": []}
    device = torch.device(args.device)
    stage_seconds(1, True, split, config, 0, device)  # warm-up: imports, allocator, kernels
    for r in range(args.repeats):
        runs["one"].append(stage_seconds(1, True, split, config, r, device))
        runs["stacked"].append(stage_seconds(args.members, True, split, config, r, device))
        runs["one_by_one"].append(stage_seconds(args.members, False, split, config, r, device))
        runs["hand_one"].append(hand_stacked_seconds(1, split, config, r, device))
        runs["hand_stacked"].append(hand_stacked_seconds(args.members, split, config, r, device))
    ratios = {k: statistics.median(t / o for t, o in zip(runs[k], runs["one"])) for k in ("stacked", "one_by_one")}
    ratios["bound"] = statistics.median(t / o for t, o in zip(runs["hand_stacked"], runs["hand_one"]))
    print(
        f"{args.members} members / 1 member: stacked {ratios['stacked']:.2f}x, one by one {ratios['one_by_one']:.2f}x, "
        f"bound (hand-written stacked loop) {ratios['bound']:.2f}x (1 member: {statistics.median(runs['one']):.2f} s)"
    )
    vgg = {}
    for width in args.vgg_widths:
        vgg_steps_seconds(width, args.members, True, 1, device)  # warm-up
        times: dict[str, list[float]] = {"one": [], "one_by_one": [], "grouped": []}
        for _ in range(args.repeats):
            times["one"].append(vgg_steps_seconds(width, 1, False, args.vgg_steps, device))
            times["one_by_one"].append(vgg_steps_seconds(width, args.members, False, args.vgg_steps, device))
            times["grouped"].append(vgg_steps_seconds(width, args.members, True, args.vgg_steps, device))
        vgg[width] = {
            f"ratio_{k}_median": statistics.median(t / o for t, o in zip(times[k], times["one"]))
            for k in ("one_by_one", "grouped")
        } | {"seconds": times}
        print(
            f"VGG width {width}, {args.members} members / 1: one by one {vgg[width]['ratio_one_by_one_median']:.2f}x, "
            f"grouped convolutions {vgg[width]['ratio_grouped_median']:.2f}x"
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
            "ratio_bound_median": ratios["bound"],
            "seconds": runs,
            "vgg": {"steps": args.vgg_steps, "batch": 128, "widths": vgg},
        },
        load_before,
        machine,
    )


if __name__ == "__main__":
    main()
