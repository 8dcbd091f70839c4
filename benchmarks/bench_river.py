"""alma-daemon against River's own incremental models on River's streams (issue 34, item 5).

Every contender sees the same examples in the same order: a River stream read once
(``alma_daemon.data.river_streams``), cut into B contiguous chunks, its continuation held out as
the test set. Per stream and contender:

- **prequential error**: every example predicted before any model trained on it. River's models
  predict then learn one example at a time; alma-daemon predicts a whole chunk with the model it
  has (the engine's prequential measure), then its adaptive policy decides whether to train;
- **CER**: the test error after every chunk, summed over the B chunks (River's models measured at
  the same chunk boundaries on the same test set);
- **time per example**: wall and CPU seconds of the stream (alma-daemon: the engine's wall time,
  with its test passes; River: the predict-then-learn loop, without the CER's test passes) divided by
  the examples streamed. CPU seconds are the fairer figure on a shared machine: every contender uses
  one thread (torch set to one), so they do not count other jobs' time.

alma-daemon runs a team's own model (``examples/custom/tabular.py``, ``learner.model``) under the
adaptive policy. River runs ``LogisticRegression`` (standardized; one-vs-rest on multi-class
streams), ``HoeffdingAdaptiveTreeClassifier`` and ``ARFClassifier`` (10 trees), with their defaults.

    python benchmarks/bench_river.py                       # all six streams, about 10 min on 2 cores
    python benchmarks/bench_river.py --streams agrawal sea --examples 5000
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import build_config
from alma_daemon.data.river_streams import RIVER_STREAMS, RiverData, read_river
from alma_daemon.research.simulate import run_simulation

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

#: River's contenders: name -> a fresh model for a stream of that many classes.
RIVER_MODELS: dict[str, Callable[[int], Any]] = {}


def river_model(name: str) -> Callable[[Callable[[int], Any]], Callable[[int], Any]]:
    def register(build: Callable[[int], Any]) -> Callable[[int], Any]:
        RIVER_MODELS[name] = build
        return build

    return register


@river_model("river LogisticRegression")
def _logistic(classes: int) -> Any:
    from river import linear_model, multiclass, preprocessing

    model = linear_model.LogisticRegression()
    return preprocessing.StandardScaler() | (model if classes == 2 else multiclass.OneVsRestClassifier(model))


@river_model("river HoeffdingAdaptiveTree")
def _hat(classes: int) -> Any:
    from river import tree

    return tree.HoeffdingAdaptiveTreeClassifier(seed=0)


@river_model("river ARF")
def _arf(classes: int) -> Any:
    from river import forest

    return forest.ARFClassifier(seed=0)


def streamed(river: RiverData, megabatches: int) -> int:
    """The examples the chunks hold: B equal contiguous chunks, the remainder dropped."""
    return len(river.train) // megabatches * megabatches


def as_dicts(river: RiverData, data: Any) -> list[dict[str, float]]:
    names = river.task.extra["features"]
    return [dict(zip(names, row)) for row in data.x.tolist()]


def run_river_model(name: str, river: RiverData, megabatches: int) -> dict:
    """Predict then learn every streamed example in order; the test error after every chunk."""
    model = RIVER_MODELS[name](river.task.num_classes)
    count = streamed(river, megabatches)
    size = count // megabatches
    xs, ys = as_dicts(river, river.train)[:count], river.train.y.tolist()[:count]
    test_xs, test_ys = as_dicts(river, river.test), river.test.y.tolist()
    errors, test_errors, wall, cpu = 0, [], 0.0, 0.0
    for start in range(0, count, size):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        for x, y in zip(xs[start : start + size], ys[start : start + size]):
            errors += model.predict_one(x) != y
            model.learn_one(x, y)
        wall += time.perf_counter() - wall_start
        cpu += time.process_time() - cpu_start
        wrong = sum(model.predict_one(x) != y for x, y in zip(test_xs, test_ys))
        test_errors.append(wrong / len(test_ys))
    return summary(errors / count, test_errors, wall, cpu, count)


def run_alma(stream: str, examples: int, megabatches: int, seed: int) -> dict:
    """``alma simulate`` of the stream: the team's MLP of examples/custom/tabular.py, the adaptive policy,
    the default training (up to 100 epochs a stage, early stopping after 25)."""
    config = build_config(
        {
            "dataset": {"name": "river", "river_stream": stream, "river_examples": examples},
            "stream": {"megabatches": megabatches, "seed": seed},
            "learner": {"name": "sm", "model": "examples.custom.tabular:build"},
            "policy": {"name": "adaptive"},
        }
    )
    cpu_start = time.process_time()
    results = run_simulation(config, progress=False)
    cpu = time.process_time() - cpu_start
    series, done = results["series"], results["summary"]
    count = series[-1]["examples_seen"]
    # Chunks are of equal size, so the mean of the chunks' prequential errors is the per-example one.
    prequential = done["cumulative_prequential_error"] / done["chunks"]
    figures = summary(prequential, [row["test_error"] for row in series], done["wall_seconds"], cpu, count)
    return {**figures, "stages": done["stages"]}


def summary(prequential: float, test_errors: list[float], wall: float, cpu: float, count: int) -> dict:
    return {
        "prequential_error": prequential,
        "cer": sum(test_errors),
        "final_test_error": test_errors[-1],
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "wall_us_per_example": 1e6 * wall / count,
        "cpu_us_per_example": 1e6 * cpu / count,
        "examples": count,
    }


def table(results: dict[str, dict[str, dict]]) -> str:
    lines = [
        "| stream | contender | prequential error | CER | final test error | CPU µs/example | wall µs/example |",
        "|---|---|---|---|---|---|---|",
    ]
    for stream, contenders in results.items():
        for name, r in contenders.items():
            lines.append(
                f"| {stream} | {name} | {r['prequential_error']:.4f} | {r['cer']:.3f} | {r['final_test_error']:.4f} "
                f"| {r['cpu_us_per_example']:.0f} | {r['wall_us_per_example']:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", nargs="+", default=list(RIVER_STREAMS), choices=list(RIVER_STREAMS))
    parser.add_argument("--examples", type=int, default=20000, help="dataset.river_examples (a tenth is the test set)")
    parser.add_argument("--megabatches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "river.json"))
    args = parser.parse_args()
    # One thread for every contender: River is single-threaded Python, and CPU seconds stay comparable.
    torch.set_num_threads(1)
    os.chdir(ROOT)  # learner.model is imported from the working directory
    load_before = os.getloadavg()
    results: dict[str, dict[str, dict]] = {}
    for stream in args.streams:
        river = read_river(stream, args.examples, args.seed)
        contenders = {"alma-daemon MLP (adaptive)": run_alma(stream, args.examples, args.megabatches, args.seed)}
        for name in RIVER_MODELS:
            contenders[name] = run_river_model(name, river, args.megabatches)
        results[stream] = contenders
        print(table({stream: contenders}).split("\n", 2)[2], flush=True)
    settings = {key: getattr(args, key) for key in ("examples", "megabatches", "seed")}
    write_figures(args.out, {"settings": settings, "streams": results}, load_before)
    markdown = Path(args.out).with_suffix(".md")
    markdown.write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
