"""What the policy benchmarks share (bench_policy.py, and bench_gens_growth.py and bench_last_stage.py,
which read its cache): the settings (a stream and a learner), the policies' labels, the cache keys and
one run's compact record, run through the research layer's run pool.

A helper module, not a benchmark: the scripts import it from their folder (on ``sys.path`` when a
script runs), as they import ``figures_file``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from alma_daemon.research.run_pool import PoolRun, RecordFile, resume, run_each

RESULTS = Path(__file__).resolve().parent / "results"

WAITS_500 = [1, 2, 5, 10, 25, 50]
WAITS_100 = [1, 2, 5, 10, 25]
RATIOS = [0.25, 0.5, 1.0, 2.0]
GROW_EVERY = [1, 2, 5]

RIVER = {
    "dataset.name": "river",
    "learner.name": "sm",
    "learner.model": "examples.custom.tabular:build",
    "stream.megabatches": 100,
}
#: name -> (config overrides, waits of the fixed schedules, what the setting is)
SETTINGS: dict[str, tuple[dict, list[int], str]] = {
    "mnist-sm4": (
        {"learner.name": "sm", "learner.width": 4, "stream.megabatches": 500},
        WAITS_500,
        "MNIST, B = 500, SM width 4",
    ),
    "mnist-sm64": (
        {"learner.name": "sm", "learner.width": 64, "stream.megabatches": 500},
        WAITS_500,
        "MNIST, B = 500, SM width 64",
    ),
    "mnist-ens8": (
        {"learner.name": "ens", "learner.width": 8, "learner.members": 5, "stream.megabatches": 500},
        WAITS_500,
        "MNIST, B = 500, Ens of 5 width 8",
    ),
    "mnist-sm16": (
        {"learner.name": "sm", "learner.width": 16, "stream.megabatches": 500},
        WAITS_500,
        "MNIST, B = 500, SM width 16 (held out: not run while the rules were designed)",
    ),
    "mnist-sm64-rotate": (
        {
            "learner.name": "sm",
            "learner.width": 64,
            "stream.megabatches": 100,
            "stream.drift.kind": "rotate",
            "stream.drift.degrees": 90.0,
            "stream.drift.at": 50,
        },
        WAITS_100,
        "MNIST, B = 100, SM width 64, images rotated 90 degrees from chunk 50 (held out)",
    ),
    "mnist-sm64-drift": (
        {
            "learner.name": "sm",
            "learner.width": 64,
            "stream.megabatches": 100,
            "stream.drift.kind": "permute_labels",
            "stream.drift.at": 50,
        },
        WAITS_100,
        "MNIST, B = 100, SM width 64, labels permuted from chunk 50",
    ),
    "cifar-sm16": (
        # The study's scale (alma study paper): 3 epochs per stage, whatever --epochs says for MNIST.
        {
            "dataset.name": "cifar10",
            "learner.name": "sm",
            "learner.width": 16,
            "stream.megabatches": 100,
            "train.epochs": 3,
        },
        WAITS_100,
        "CIFAR-10, B = 100, SM (VGG) width 16, 3 epochs per stage",
    ),
    "cifar-sm4": (
        # The study's small CIFAR-10 model; width 16 is its large one.
        {
            "dataset.name": "cifar10",
            "learner.name": "sm",
            "learner.width": 4,
            "stream.megabatches": 100,
            "train.epochs": 3,
        },
        WAITS_100,
        "CIFAR-10, B = 100, SM (VGG) width 4, 3 epochs per stage",
    ),
    # A team's own MLP (examples/custom/tabular.py) on River's streams (docs/river.md): 18,000 examples
    # in chunks of 180, the last 2,000 the test set.
    "river-agrawal": (
        {**RIVER, "dataset.river_stream": "agrawal"},
        WAITS_100,
        "River Agrawal (abrupt drift halfway), B = 100, a team's MLP",
    ),
    "river-hyperplane": (
        {**RIVER, "dataset.river_stream": "hyperplane"},
        WAITS_100,
        "River rotating hyperplane (incremental drift), B = 100, a team's MLP",
    ),
    "river-bananas": (
        {**RIVER, "dataset.river_stream": "bananas"},
        WAITS_100,
        "River Bananas (stationary, 5,300 examples), B = 100, a team's MLP",
    ),
    "mnist-gens8": (
        {"learner.name": "gens", "learner.width": 8, "stream.megabatches": 500},
        [],
        "MNIST, B = 500, gEns width 8: growth timing",
    ),
    "mnist-gmoe8": (
        {"learner.name": "gmoe", "learner.width": 8, "stream.megabatches": 500},
        [],
        "MNIST, B = 500, gMoE width 8: growth timing",
    ),
}
#: Settings where the adaptive policy is compared on growth timing (grow_every), not waiting time.
GROWTH_SETTINGS = {"mnist-gens8", "mnist-gmoe8"}


def policy_label(policy: dict) -> str:
    if policy["policy.name"] == "fixed":
        return f"fixed w={policy['policy.wait']}"
    if policy["policy.name"] == "geometric":
        if "policy.grow_every" in policy:
            return f"geometric 0.5, grow_every={policy['policy.grow_every']}"
        return f"geometric {policy['policy.ratio']:g}"
    extras = [f"k={policy['policy.stage_penalty']:g}"] if "policy.stage_penalty" in policy else []
    extras += [f"price={policy['policy.compute_price']:g}"] if "policy.compute_price" in policy else []
    extras += [f"told B={policy['policy.expected_chunks']}"] if "policy.expected_chunks" in policy else []
    return " ".join([policy["policy.name"], *extras])


def run_key(setting: str, policy: dict, seed: int, common: dict) -> str:
    return json.dumps({"setting": setting, "policy": policy, "seed": seed, "common": common}, sort_keys=True)


def run_one(setting: str, policy: dict, seed: int, common: dict, keep_series: bool) -> dict:
    """One simulated stream (in a worker process when ``--jobs`` > 1); returns its compact record."""
    import torch

    from alma_daemon.config import build_config
    from alma_daemon.research.run_pool import simulate_on_one_thread

    values = {**common, **SETTINGS[setting][0], **policy, "seed": seed, "stream.seed": seed}
    config = build_config({}, [f"{key}={json.dumps(value)}" for key, value in values.items()])
    start = time.perf_counter()
    results = simulate_on_one_thread(config)
    series = results["series"]
    record = {
        "setting": setting,
        "policy": policy_label(policy),
        "seed": seed,
        "torch": torch.__version__,
        "cer": results["summary"]["cer"],
        "final_test_error": results["summary"]["final_test_error"],
        "cumulative_train_flops": results["summary"]["cumulative_train_flops"],
        "stages": results["summary"]["stages"],
        "seconds": round(time.perf_counter() - start, 1),
        "trained_at": [r["t"] for r in series if r["trained"]],
        "grew_at": [r["t"] for r in series if r["decision"] == "grow+train"],
    }
    if keep_series:
        record["test_error"] = [round(r["test_error"], 4) for r in series]
        record["prequential_error"] = [round(r["prequential_error"], 4) for r in series]
        record["reasons"] = {r["t"]: r["reason"] for r in series if r["trained"]}
    return record


def run_missing(runs: list[PoolRun], cache: RecordFile, jobs: int) -> None:
    """Run each run whose key ``cache`` lacks, ``jobs`` at a time, saying each record's figures; a
    failed run is reported and left out, so the next invocation runs it again."""
    _, todo = resume(runs, cache)
    if not todo:
        return
    print(f"{len(todo)} run(s) to do, {jobs} at a time")
    run_each(
        todo, cache, jobs=jobs, on_done=_say_record, on_failed=lambda run, exc: print(f"FAILED {run.key}: {exc!r}")
    )


def _say_record(run: PoolRun, record: dict) -> None:
    print(
        f"{record['setting']:18} {record['policy']:32} seed {record['seed']}: CER {record['cer']:7.2f}  "
        f"FLOPs {record['cumulative_train_flops']:.3g}  stages {record['stages']:3}  {record['seconds']} s"
    )
