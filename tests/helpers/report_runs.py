"""Synthetic results for ``alma report``'s figures: rows built directly, no training.

A fraud team's backtest judged by cost (binary, rare positives, a baseline, a reference learner, the
served probabilities' reliability, the model's age), at any length and with 1, 3 or 12 runs:

- 1 run: one ``adaptive`` configuration;
- 3 runs: ``fixed`` wait=1, ``fixed`` wait=4 and ``adaptive``, one seed (a policies section);
- 12 runs: those three at two widths, two seeds each (two policies sections, four CER lines).

The training FLOPs of the runs lie within a few percent of each other, as the fraud example's do: the
case where a log axis labels its ticks ``3.5e9, 3.5e9, 3.6e9``. The history spans 60 days (its
``when`` column), the last 6 the test set: each row carries its chunk's time (``chunk_time``, the
newest row's), as a backtest of a table with a time column records it, unless asked to leave it out.
"""

from __future__ import annotations

import functools
import json
import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

from alma_daemon.measures.decision import RELIABILITY_EDGES
from alma_daemon.observability.report import Run
from alma_daemon.observability.results import results_text

MEASURE = "cost"
#: The history's first moment and the days its chunks span (60 days, the last 6 held out as the test set).
HISTORY_START = datetime(2024, 1, 1, tzinfo=timezone.utc)
STREAMED_DAYS = 54.0
#: The configurations of each layout: (learner width, policy section).
LAYOUTS: dict[int, tuple[list[tuple[int, dict]], int]] = {
    1: ([(8, {"name": "adaptive"})], 1),
    3: ([(8, {"name": "fixed", "wait": 1}), (8, {"name": "fixed", "wait": 4}), (8, {"name": "adaptive"})], 1),
    12: (
        [
            (width, policy)
            for width in (8, 16)
            for policy in ({"name": "fixed", "wait": 1}, {"name": "fixed", "wait": 4}, {"name": "adaptive"})
        ],
        2,
    ),
}


def config(width: int, policy: dict, chunks: int, seed: int) -> dict:
    """A table task's config as results.json holds it (the keys the report reads)."""
    return {
        "dataset": {"name": "table", "files": ["runs/data/transactions.csv"], "time_column": "when"},
        "task": {"measure": MEASURE, "classes": ["ok", "fraud"]},
        "stream": {"megabatches": chunks, "seed": seed, "prequential_window": 50},
        "learner": {"name": "sm", "width": width, "model": "examples.custom.tabular:build"},
        "policy": {"max_model_age_chunks": None, "max_model_age_seconds": None, **policy},
        "seed": seed,
    }


def _trains(policy: dict, t: int, age: int) -> bool:
    if policy["name"] == "fixed":
        return age + 1 >= policy["wait"]
    return t <= 3 or age >= 2 or t % 7 == 0  # adaptive: often at first, then every few chunks


#: Where a chunk's 1,800 served probabilities fall: (bin index between RELIABILITY_EDGES, examples).
_SERVED = ((0, 1500), (3, 120), (5, 80), (7, 50), (9, 20), (12, 10), (21, 10))
_BIN_COUNT = len(RELIABILITY_EDGES) - 1


@functools.cache
def _reliability(sharp: float, noise: float) -> list[list[float]]:
    """A chunk's served probabilities in bins: most near 0, a few near 1, about 2 % positive; a ``sharp``
    model (0 to 1) serves more of them near 1, and is a little overconfident. Cached: rows share them."""
    bins = [[0.0, 0.0, 0.0] for _ in range(_BIN_COUNT)]
    for index, examples in _SERVED:
        examples += round(30 * sharp) if index >= 12 else 0
        served = (RELIABILITY_EDGES[index] + RELIABILITY_EDGES[index + 1]) / 2
        positives = min(examples, round(examples * served * (0.8 + 0.4 * sharp) * noise))
        bins[index] = [float(examples), examples * served, float(positives)]
    return bins


def chunk_time(t: int, chunks: int) -> str:
    """The time of chunk ``t`` of ``chunks`` (its newest row's), as a backtest's row writes it."""
    return (HISTORY_START + timedelta(days=STREAMED_DAYS * t / chunks)).isoformat()


def rows(width: int, policy: dict, chunks: int, seed: int, *, history_time: bool = True) -> list[dict]:
    """The rows of one run, keyed as results.json keys them (a test reads one back with
    ``StepRecord.from_row``): costs that fall as the model trains, an untrained first chunk far above;
    each with its chunk's time in the history unless ``history_time`` is False."""
    rng = random.Random(f"{width}-{policy}-{seed}")
    out: list[dict] = []
    age, version, flops, parameters, cumulative, preq_sum, ref_sum = 0, 0, 0, 0, 0.0, 0.0, 0.0
    window: list[float] = []
    reference_window: list[float] = []
    # A stage trains on the chunks that waited for it: the FLOPs of every policy come out within a few
    # percent of each other, as on a real stream.
    per_chunk = 178_000_000 * width // 8
    size = 6274 * width // 8
    for t in range(1, chunks + 1):
        trained = t == 1 or _trains(policy, t, age)
        learnt = 1.0 - math.exp(-3.0 * t / chunks)
        prequential = 2.0 if t == 1 else 0.45 - 0.3 * learnt + 0.05 * rng.random() + 0.02 * age
        reference = 0.6 if t == 1 else 0.3 - 0.1 * learnt + 0.04 * rng.random()
        window = (window + [prequential])[-50:]
        reference_window = (reference_window + [reference])[-50:]
        stage_flops = round(per_chunk * (age + 1) * (1 + 0.1 * rng.random())) if trained else 0
        version, flops, age = (version + 1, flops + stage_flops, 0) if trained else (version, flops, age + 1)
        test = 0.62 - 0.45 * learnt + 0.03 * rng.random() + 0.01 * age - 0.02 * width / 8
        cumulative, preq_sum, ref_sum, parameters = (
            cumulative + test,
            preq_sum + prequential,
            ref_sum + reference,
            parameters + size,
        )
        row = {
            "t": t,
            "chunk": t,
            "examples_seen": 1800 * t,
            "trained": trained,
            "decision": "train" if trained else "wait",
            "reason": "synthetic",
            f"test_{MEASURE}": test,
            f"prequential_{MEASURE}": prequential,
            f"cumulative_prequential_{MEASURE}": preq_sum,
            f"prequential_window_{MEASURE}": sum(window) / len(window),
            "model_age_chunks": age,
            "model_age_seconds": 0.01 + 0.05 * age,  # a backtest's machine time: how fast it trained
            "train_flops": stage_flops,
            "cumulative_train_flops": flops,
            "parameters": size,
            "cumulative_parameters": parameters,
            "inference_flops_per_example": 12288.0,
            "train_seconds": 0.05 if trained else 0.0,
            "cumulative_train_seconds": 0.05 * version,
            "model_version": version,
            "wall_seconds": 0.06 * t,
            f"cumulative_{MEASURE}": cumulative,
            "test_measures": {"recall": learnt * 0.8, "precision": learnt * 0.3, "pr_auc": learnt * 0.6},
            "prequential_measures": {"recall": learnt * 0.7, "precision": learnt * 0.25, "pr_auc": learnt * 0.5},
            "reliability": _reliability(round(learnt * width / 16, 2), round(0.9 + 0.2 * rng.random(), 2)),
            f"baseline_{MEASURE}": 0.585,
            f"reference_{MEASURE}": reference,
            f"cumulative_reference_{MEASURE}": ref_sum,
            f"reference_window_{MEASURE}": sum(reference_window) / len(reference_window),
        }
        if history_time:
            row["chunk_time"] = chunk_time(t, chunks)
        if trained:
            row |= {"stage": version, "kind": "finetune", "epochs": 3, "best_epoch": 2, "steps": 40}
            row |= {f"val_{MEASURE}": prequential, "train_flops_per_example": 1e5}
        out.append(row)
    return out


def summary(series: list[dict]) -> dict:
    """What the report reads of a run's summary (observability/results.py writes it from the rows)."""
    last = series[-1]
    return {
        "chunks": len(series),
        "stages": last["model_version"],
        "cumulative_train_flops": last["cumulative_train_flops"],
        "cumulative_parameters": last["cumulative_parameters"],
        "final_parameters": last["parameters"],
        "wall_seconds": last["wall_seconds"],
        "measure": MEASURE,
        "higher_is_better": False,
        f"final_test_{MEASURE}": last[f"test_{MEASURE}"],
        f"cumulative_{MEASURE}": last[f"cumulative_{MEASURE}"],
        f"cumulative_prequential_{MEASURE}": last[f"cumulative_prequential_{MEASURE}"],
        f"baseline_{MEASURE}": last[f"baseline_{MEASURE}"],
        "final_test_measures": last["test_measures"],
    }


def synthetic_runs(chunks: int, runs: int, *, arrival_times: bool = False, history_time: bool = True) -> list[Run]:
    """``runs`` (1, 3 or 12) runs of ``chunks`` chunks each, laid out as :data:`LAYOUTS` says; a
    daemon's where ``arrival_times`` (its ages in seconds are the stream's, its rows without a
    ``chunk_time``), else a backtest's, whose rows carry their chunk's time where ``history_time``."""
    configurations, seeds = LAYOUTS[runs]
    found = []
    for width, policy in configurations:
        for seed in range(seeds):
            series = rows(width, policy, chunks, seed, history_time=history_time and not arrival_times)
            results = {"config": config(width, policy, chunks, seed), "series": series, "summary": summary(series)}
            name = f"w{width}-{policy['name']}{policy.get('wait', '')}-s{seed}"
            found.append(Run(name, results, arrival_times=arrival_times))
    return found


def write_runs(folder: Path, chunks: int, runs: int) -> Path:
    """:func:`synthetic_runs` written as one results.json per run under ``folder``, as ``alma grid`` lays them out."""
    for run in synthetic_runs(chunks, runs):
        out = folder / run.name
        out.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(row) for row in run.series]
        (out / "results.json").write_text(results_text(run.results, lines))
    return folder
