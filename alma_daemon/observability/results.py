"""The results log of a run: ``results.json`` (config, series, summary) and ``series.csv``.

Written after every step, atomically, so ``alma report`` can read a run that is still going.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path

from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.core.engine import Engine, EngineObserver, EngineState
from alma_daemon.core.records import StageRecord, StepRecord, read_rows

#: Columns of series.csv, in order; other fields stay in results.json only.
CSV_COLUMNS = [
    "t",
    "chunk",
    "examples_seen",
    "trained",
    "decision",
    "test_error",
    "prequential_error",
    "cumulative_error",
    "test_perplexity",
    "prequential_perplexity",
    "train_flops",
    "cumulative_train_flops",
    "parameters",
    "cumulative_parameters",
    "inference_flops_per_example",
    "train_seconds",
    "model_version",
    "wall_seconds",
]


def summarize(series: list[dict], wall_seconds: float, state: EngineState | None = None) -> dict:
    """The run's summary: CER (Eq. 1), final error, cumulative FLOPs and parameters (Eq. 2).

    Stages, training FLOPs and seconds come from the running totals, not by counting trained steps:
    a time-based policy's stages between chunks (Engine.on_tick) have no step record of their own.
    The engine's ``state`` holds them up to its last stage; without it, the last record does up to
    its chunk. The rest (final errors, parameters, inference cost) is the last chunk's, measured
    before any stage trained since.
    """
    records = read_rows(series)
    last: StepRecord | None = records[-1] if records else None
    # Both carry model_version and the cumulative training FLOPs and seconds.
    totals: EngineState | StepRecord | None = state if state is not None else last
    summary = {
        "chunks": len(records),
        "stages": totals.model_version if totals else 0,
        "cumulative_train_flops": totals.cumulative_train_flops if totals else 0,
        "cumulative_parameters": last.cumulative_parameters if last else 0,
        "final_parameters": last.parameters if last else None,
        "final_inference_flops_per_example": last.inference_flops_per_example if last else None,
        "train_seconds": totals.cumulative_train_seconds if totals else 0.0,
        "wall_seconds": wall_seconds,
    }
    if last is not None and last.measure == "error":
        summary["cer"] = last.cumulative_error
        summary["final_test_error"] = last.test
        summary["cumulative_prequential_error"] = last.cumulative_prequential
    perplexities = [r.test for r in records if r.measure == "perplexity" and r.test is not None]
    if perplexities:
        summary["final_test_perplexity"] = perplexities[-1]
        summary["average_test_perplexity"] = sum(perplexities) / len(perplexities)
    return summary


def write_series_csv(path: Path, series: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for record in series:
            writer.writerow({k: "" if record.get(k) is None else record.get(k) for k in CSV_COLUMNS})
    os.replace(tmp, path)


class ResultsWriter(EngineObserver):
    """Keeps ``results.json`` and ``series.csv`` of a run up to date after every step, and after every
    stage trained between chunks."""

    def __init__(self, folder: str | Path, config: dict, extra: dict | None = None):
        self.folder = Path(folder)
        self.config = config
        self.extra = extra or {}
        self.folder.mkdir(parents=True, exist_ok=True)

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        self.write(engine)

    def on_tick_stage(self, stage: StageRecord, engine: Engine) -> None:
        self.write(engine)

    def write(self, engine: Engine) -> dict:
        results = results_of(engine, self.config, self.extra)
        write_json_atomic(self.folder / "results.json", results)
        write_series_csv(self.folder / "series.csv", results["series"])
        return results


def results_of(engine: Engine, config: dict, extra: dict | None = None) -> dict:
    """What ``results.json`` holds for ``engine``'s run so far: ``config`` (the resolved config, as a
    dict), the series, its summary (wall time on the engine's clock, from its start) and ``extra``."""
    series = engine.state.series
    return {
        "config": config,
        "series": series,
        "summary": summarize(series, engine.clock() - engine.state.started_at, engine.state),
        **(extra or {}),
    }


def read_results(path: str | Path) -> dict:
    """Read a run's results.json (a folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    return json.loads(path.read_text())
