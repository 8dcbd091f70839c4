"""Where alma loses to its linear reference on River's linear concepts (SEA, Hyperplane): the stage recipe or
the policy? (issue 50)

alma runs as ``bench_river.py`` runs it (the team's MLP of ``examples/custom/tabular.py``, 20 chunks of a
20,000-example stream, a tenth of it the test set), under each variant of :data:`VARIANTS`: the stage recipe
(replay, validation set) and the policy (``adaptive``, or a stage at every chunk) changed one at a time, with
and without ``train.linear_candidate``. Every run also learns the River linear reference beside the network;
the figure is the served error (the mean prequential error over the stream's second half). The seeds
default to 3 and 4: ``bench_river.py``'s tables are seed 0's, so these runs chose nothing there.

    nice python benchmarks/bench_river_variants.py                      # 2 streams x 8 variants x 2 seeds, ~15 min
    nice python benchmarks/bench_river_variants.py --streams sea --variants adaptive fixed-1 --seeds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import build_config
from alma_daemon.research.simulate import run_simulation

RESULTS = Path(__file__).parent / "results"

#: name -> config sections merged into the run's (``policy`` replaces adaptive).
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "adaptive": {},
    "adaptive, own chunks' validation": {"stream": {"validation_examples": 0}},
    "adaptive, window replay": {"stream": {"replay_keep": "window", "replay_examples": 4000}},
    "adaptive, old recipe": {"stream": {"replay": False, "validation_examples": 0}},
    "adaptive, old recipe, linear candidate": {
        "stream": {"replay": False, "validation_examples": 0},
        "train": {"linear_candidate": True},
    },
    "fixed-1": {"policy": {"name": "fixed", "wait": 1}},
    "fixed-1, linear candidate": {"policy": {"name": "fixed", "wait": 1}, "train": {"linear_candidate": True}},
}


def run(stream: str, variant: str, seed: int, examples: int, megabatches: int) -> dict[str, float]:
    """One simulation; its served error, its reference's, and its training FLOPs."""
    sections = VARIANTS[variant]
    config = build_config(
        {
            "seed": seed,
            "dataset": {"name": "river", "river_stream": stream, "river_examples": examples},
            "stream": {"megabatches": megabatches, "seed": seed, **sections.get("stream", {})},
            "learner": {"name": "sm", "model": "examples.custom.tabular:build"},
            "policy": sections.get("policy", {"name": "adaptive"}),
            "train": sections.get("train", {}),
        }
    )
    summary = run_simulation(config, progress=False)["summary"]
    return {
        "served": summary["served_error"],
        "reference": summary["served_reference_error"],
        "flops": summary["cumulative_train_flops"],
    }


def table(results: dict[str, dict[str, list[dict[str, float]]]], seeds: list[int]) -> str:
    lines = [
        f"River seeds {seeds}; served error (mean over the seeds; lower is better) and training FLOPs.",
        "",
        "| stream | variant | served | linear reference | served / reference | training FLOPs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for stream, variants in results.items():
        for variant, runs in variants.items():
            served = statistics.mean(r["served"] for r in runs)
            reference = statistics.mean(r["reference"] for r in runs)
            flops = statistics.mean(r["flops"] for r in runs)
            lines.append(
                f"| {stream} | {variant} | {served:.4f} | {reference:.4f} | {served / reference:.2f} | {flops:.3g} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", nargs="+", default=["sea", "hyperplane"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4])
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--megabatches", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS / "river_variants.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for stream in args.streams:
        for variant in args.variants:
            runs = [run(stream, variant, seed, args.examples, args.megabatches) for seed in args.seeds]
            results.setdefault(stream, {})[variant] = runs
            print(stream, variant, [round(r["served"], 4) for r in runs], flush=True)
    write_figures(args.out, {"settings": vars(args), "runs": results}, load_before)
    markdown = Path(args.out).with_suffix(".md")
    markdown.write_text(table(results, args.seeds))
    print(f"written: {markdown}")


if __name__ == "__main__":
    main()
