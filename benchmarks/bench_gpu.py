"""GPU benchmark (issue 14, item 5): model FLOPs utilization (MFU) and the examples' wall times on CUDA.

Three parts, each in seconds to a couple of minutes on an H100 (``--parts`` picks some):

- ``mfu-vgg``: reduced VGG19-BN on CIFAR-10 in bf16 (``train.precision: bf16``), at the paper's largest
  width (32) and at a GPU-sized width (512), trained by our loop (augmentation, validation passes).
- ``mfu-lm``: the Switch LM at the paper's base size (6 blocks, d_model 512, 8 heads, FFN 2048, 4
  experts, sequences of 512 tokens; docs/language-modeling.md) on PTB, in bf16, at 32 sequences a
  step and at the paper's 192 (which it reached over 8 GPUs).
- ``examples``: ``examples/mnist-sm.yaml`` (all 10 chunks), ``cifar-sm.yaml`` (4 chunks, 2 stages) and
  ``ptb-switch-lm.yaml`` (2 chunks) through the engine as configured (fp32), on the GPU.

MFU = our counted FLOPs / seconds / the GPU's peak for the dtype (dense, from :data:`PEAK_FLOPS` by
``torch.cuda.get_device_name()``). The FLOPs are the ones the training loop counts and reports
(``FlopCounterMode`` on the first step of each shape: forward and backward matmuls and convolutions,
validation passes included; elementwise work is not counted). Seconds are the difference between
two fits of different lengths on a warmed-up model, so fixed costs (the counted first step,
compilation, cuDNN autotuning, copying the data) cancel out. ``--compile`` adds ``train.compile``
variants (CUDA graphs). ``--smoke`` runs every part at toy sizes, also on a CPU, to check the script.

    python benchmarks/bench_gpu.py [--data-dir DIR] [--parts mfu-vgg mfu-lm examples] [--compile] [--smoke]

The data folder is ``--data-dir``, else ``$ALMA_DATA_DIR``, else ``./data``, else ``../shared/data``.
Figures go to ``benchmarks/results/gpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from alma_daemon.config import DatasetConfig, StreamConfig, TrainConfig, learner_config, load_config
from alma_daemon.data.datasets import load_dataset
from alma_daemon.data.streams import Chunk, partition, split_chunk
from alma_daemon.data.text import text_stream
from alma_daemon.learners import build_learner
from alma_daemon.learners.switch_lm import validation_loss
from alma_daemon.models.backbones import build_backbone
from alma_daemon.research import simulate
from alma_daemon.training.loop import Trainer

REPO = Path(__file__).resolve().parents[1]

#: Dense peak FLOP/s by GPU name (first match in order wins): bf16 tensor cores, and fp32 without TF32.
#: H100 SXM and H200 share the compute die; PCIe and NVL parts run at lower clocks/power.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989e12, "fp32": 67e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "fp32": 60e12}),
    ("H100", {"bf16": 989e12, "fp32": 67e12}),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp32": 91.6e12}),
    ("L4", {"bf16": 121e12, "fp32": 30.3e12}),
    ("A10", {"bf16": 125e12, "fp32": 31.2e12}),
]

#: The paper's base Switch Transformer (section 5), on PTB's 10k-word vocabulary; every block's FFN is a Switch
#: layer. No dropout, as in examples/ptb-switch-lm*.yaml (attention then runs as one fused kernel on CUDA).
LM_BASE = {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "experts": 4, "dropout": 0.0}
LM_SMOKE = {"layers": 1, "d_model": 32, "heads": 2, "d_ff": 64, "experts": 2, "dropout": 0.0}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def peak_flops(device: torch.device, dtype: str) -> float | None:
    if device.type != "cuda":
        return None
    name = device_name(device)
    return next((peaks[dtype] for key, peaks in PEAK_FLOPS if key in name), None)


def utilization(runs: list, device: torch.device, dtype: str) -> dict:
    """FLOP/s and MFU from two fits (short, long): the difference removes each fit's fixed costs."""
    (short_flops, short_seconds), (long_flops, long_seconds) = runs
    flops, seconds = long_flops - short_flops, long_seconds - short_seconds
    rate = flops / seconds if seconds > 0 else None
    peak = peak_flops(device, dtype)
    return {
        "counted_flops": flops,
        "seconds": seconds,
        "flops_per_second": rate,
        "peak_flops": peak,
        "mfu": rate / peak if rate and peak else None,
    }


def fit_twice(fit, short: int, long: int) -> list[tuple[int, float]]:
    """Warm up with a short fit, then time a short and a long one; (counted FLOPs, seconds) of the timed two."""
    fit(short)
    return [fit(n) for n in (short, long)]


def mfu_vgg(device: torch.device, smoke: bool, with_compile: bool) -> list[dict]:
    dataset = load_dataset("cifar10")
    examples, val_examples = (256, 64) if smoke else (10000, 1000)
    chunk = Chunk(1, partition(dataset.train, 1, seed=0, limit=examples + val_examples)[0])
    split = split_chunk(chunk, val_examples / (examples + val_examples), seed=0)
    cases = [(4, 64)] if smoke else [(32, 128), (512, 256)]
    results = []
    for width, batch in cases:
        for compile_flag in [False, True] if with_compile else [False]:
            torch.manual_seed(0)
            net = build_backbone(dataset.task, width).to(device)

            def fit(epochs: int) -> tuple[int, float]:
                config = TrainConfig(
                    epochs=epochs, patience=epochs, batch_size=batch, precision="bf16", compile=compile_flag
                )
                report = Trainer(config, "sgd", device, seed=epochs, augment=True).fit(net, split.train, split.val)
                return report.flops, report.seconds

            short, long = (1, 2) if smoke else (1, 3)
            result = {
                "model": f"vgg19-bn width {width}",
                "batch": batch,
                "train_examples": len(split.train),
                "precision": "bf16",
                "compile": compile_flag,
                "epochs": [short, long],
                **utilization(fit_twice(fit, short, long), device, "bf16"),
            }
            print(f"VGG width {width}, batch {batch}, compile {compile_flag}: {_rate(result)}", flush=True)
            results.append(result)
    return results


def mfu_lm(
    device: torch.device, data_dir: str | None, smoke: bool, with_compile: bool, batches: list[int]
) -> list[dict]:
    size = LM_SMOKE if smoke else LM_BASE
    seq_len = 32 if smoke else 512
    stream = text_stream(DatasetConfig(name="ptb", root=data_dir), StreamConfig(megabatches=4, seq_len=seq_len))
    data = stream.chunks[0].data
    train, val = data.subset(slice(0, len(data) - 16)), data.subset(slice(len(data) - 16, len(data)))
    results = []
    for batch, compile_flag in [
        (b, c) for b in ([4] if smoke else batches) for c in ([False, True] if with_compile else [False])
    ]:
        learner = build_learner("switch-lm", stream.task, learner_config(name="switch-lm", **size), seed=0).to(device)

        def fit(steps: int) -> tuple[int, float]:
            config = TrainConfig(
                batch_size=batch, steps_per_chunk=steps, warmup_steps=2, lr=3e-4, precision="bf16", compile=compile_flag
            )
            report = Trainer(config, "adam", device, seed=steps).fit(
                learner.model, train, val, objective=learner.objective, steps=steps, validate=validation_loss
            )
            return report.flops, report.seconds

        short, long = (2, 4) if smoke else (10, 40)
        result = {
            "model": "switch-lm " + json.dumps(size),
            "seq_len": seq_len,
            "batch": batch,
            "parameters": learner.num_parameters(),
            "precision": "bf16",
            "compile": compile_flag,
            "steps": [short, long],
            **utilization(fit_twice(fit, short, long), device, "bf16"),
        }
        print(f"Switch LM, batch {batch}x{seq_len}, compile {compile_flag}: {_rate(result)}", flush=True)
        results.append(result)
    return results


#: (example config, chunks to run, overrides in --smoke mode)
EXAMPLES = [
    ("mnist-sm.yaml", 10, ["stream.train_examples=600", "train.epochs=2", "dataset.test_examples=200"]),
    (
        "cifar-sm.yaml",
        4,
        ["stream.train_examples=400", "train.epochs=1", "dataset.test_examples=100", "learner.width=4"],
    ),
    (
        "ptb-switch-lm.yaml",
        2,
        [
            "stream.train_examples=64",
            "train.steps_per_chunk=3",
            "train.warmup_steps=1",
            "dataset.test_examples=8",
            "learner.d_model=32",
            "learner.d_ff=64",
            "learner.layers=1",
        ],
    ),
]


def examples(device: torch.device, data_dir: str | None, smoke: bool) -> list[dict]:
    results = []
    for name, chunks, smoke_overrides in EXAMPLES:
        overrides = [f"device={device}"] + ([f"dataset.root={data_dir}"] if data_dir else [])
        config = load_config(REPO / "examples" / name, overrides + (smoke_overrides if smoke else []))
        stream = simulate.simulated_stream(config)
        engine = simulate.build_engine(config, stream, observers=[])
        start = time.perf_counter()
        for chunk, _ in zip(stream.chunks, range(chunks)):
            engine.on_chunk(chunk)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
        series = engine.state.series
        measure = engine.learner.measure
        result = {
            "example": name,
            "chunks": len(series),
            "stages": engine.state.stages_done,
            "wall_seconds": wall,
            "train_seconds": engine.state.cumulative_train_seconds,
            "train_flops": engine.state.cumulative_train_flops,
            f"last_test_{measure}": series[-1].get(f"test_{measure}") if series else None,
            "stage_seconds": [r["train_seconds"] for r in series if r["trained"]],
        }
        print(
            f"{name}: {result['chunks']} chunks, {result['stages']} stages, wall {wall:.1f} s, "
            f"training {result['train_seconds']:.1f} s, last test {measure} {result[f'last_test_{measure}']}",
            flush=True,
        )
        results.append(result)
    return results


def _rate(result: dict) -> str:
    rate = result["flops_per_second"]
    mfu = f", MFU {result['mfu']:.1%}" if result["mfu"] is not None else ""
    return f"{rate / 1e12:.2f} TFLOP/s{mfu}" if rate else "no timing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder holding mnist/, cifar10*/ and ptb/")
    parser.add_argument(
        "--parts", nargs="*", default=["mfu-vgg", "mfu-lm", "examples"], choices=["mfu-vgg", "mfu-lm", "examples"]
    )
    parser.add_argument("--compile", action="store_true", help="also measure with train.compile (CUDA graphs)")
    parser.add_argument(
        "--lm-batches",
        type=int,
        nargs="*",
        default=[32, 192],
        help="sequences per LM step (the paper: 192 of 512 tokens, over 8 GPUs with accumulation)",
    )
    parser.add_argument("--smoke", action="store_true", help="toy sizes, any device: checks the script runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="default benchmarks/results/gpu.json (gpu-smoke.json with --smoke)")
    args = parser.parse_args()
    if args.data_dir:
        os.environ["ALMA_DATA_DIR"] = str(Path(args.data_dir).resolve())
    data_dir = os.environ.get("ALMA_DATA_DIR")
    device = torch.device(args.device)
    if device.type != "cuda" and not args.smoke:
        parser.error("no CUDA device: run on a GPU, or pass --smoke to check the script at toy sizes")
    started = time.perf_counter()
    results: dict = {
        "device": device_name(device),
        "torch": torch.__version__,
        "smoke": args.smoke,
        "cuda": torch.version.cuda,
        "parts": {},
    }
    for part in args.parts:
        if part == "mfu-vgg":
            results["parts"][part] = mfu_vgg(device, args.smoke, args.compile)
        elif part == "mfu-lm":
            results["parts"][part] = mfu_lm(device, data_dir, args.smoke, args.compile, args.lm_batches)
        else:
            results["parts"][part] = examples(device, data_dir, args.smoke)
    results["total_seconds"] = time.perf_counter() - started
    out = Path(args.out or REPO / "benchmarks" / "results" / ("gpu-smoke.json" if args.smoke else "gpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"written: {out} ({results['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
