"""Share of ``alma simulate``'s wall time spent outside training (issue 14: at most 10% at MNIST B = 500, w = 10).

Runs the README's main job (MNIST, SM width 64) with many small mega-batches and a waiting time w,
in process, and reports 1 - training seconds / wall seconds, where training seconds are the
stages' own (``train_seconds``: the training loop, its validation passes included). What is left
is the engine's work around training: the prequential pass on every chunk, the test-set pass,
splitting and buffering chunks, the post-stage validation measure, results bookkeeping.
``--every-chunk`` also runs the engine as it was before the test-set skip (a test pass after every
chunk), interleaved, for the before/after figure. The CER and final error must match.

    python benchmarks/bench_engine_overhead.py [--megabatches 500] [--waits 10 1] [--every-chunk]
"""

from __future__ import annotations

import argparse
import os

from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import build_config
from alma_daemon.core import assembly
from alma_daemon.core.engine import Engine
from alma_daemon.research import simulate


class MeasureEveryChunk(Engine):
    """The engine before the skip: a test-set pass after every chunk."""

    built = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        MeasureEveryChunk.built += 1

    def test_measure(self, test_set):
        if test_set is None:
            return None
        measurement, details = self.learner.assess(test_set)
        return measurement.value, details


def run(megabatches: int, wait: int, epochs: int, engine_class: type[Engine]) -> dict:
    config = build_config(
        {
            "dataset": {"name": "mnist"},
            "stream": {"megabatches": megabatches, "seed": 0},
            "learner": {"name": "sm", "width": 64},
            "train": {"epochs": epochs, "patience": 25},
            "policy": {"name": "fixed", "wait": wait},
        }
    )
    # The one engine factory builds every engine; the run must go through the class asked for (an
    # earlier version swapped the class where the simulator no longer looked it up, and compared the
    # engine with itself).
    built_before = MeasureEveryChunk.built
    original = assembly.Engine
    assembly.Engine = engine_class
    try:
        results = simulate.run_simulation(config, progress=False)
    finally:
        assembly.Engine = original
    if engine_class is MeasureEveryChunk and MeasureEveryChunk.built == built_before:
        raise RuntimeError("the simulation did not build the engine class it was given")
    summary = results["summary"]
    wall, train = summary["wall_seconds"], summary["train_seconds"]
    return {
        "megabatches": megabatches,
        "wait": wait,
        "epochs": epochs,
        "engine": engine_class.__name__,
        "wall_seconds": wall,
        "train_seconds": train,
        "outside_training_share": 1 - train / wall,
        "cer": summary.get("cer"),
        "final_test_error": summary.get("final_test_error"),
        "stages": summary["stages"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabatches", type=int, default=500)
    parser.add_argument("--waits", type=int, nargs="*", default=[10, 1])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--every-chunk", action="store_true", help="also run the engine without the test-set skip")
    parser.add_argument("--out", default="benchmarks/results/engine_overhead.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs = []
    for wait in args.waits:
        # With w = 1 every chunk changes the model: both engines measure after every chunk.
        for engine_class in [Engine, MeasureEveryChunk] if args.every_chunk and wait > 1 else [Engine]:
            result = run(args.megabatches, wait, args.epochs, engine_class)
            print(
                f"B={result['megabatches']} w={wait} {result['engine']}: wall {result['wall_seconds']:.1f} s, "
                f"training {result['train_seconds']:.1f} s, outside training {result['outside_training_share']:.1%}, "
                f"CER {result['cer']:.4f}"
            )
            runs.append(result)
    write_figures(args.out, {"runs": runs}, load_before)


if __name__ == "__main__":
    main()
