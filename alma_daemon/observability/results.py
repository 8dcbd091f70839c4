"""The results log of a run: ``results.json`` (config, series, summary) and ``series.csv``.

Written after every step, atomically, so ``alma report`` can read a run that is still going.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from pathlib import Path

from alma_daemon.core.engine import Engine, EngineObserver

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


def summarize(series: list[dict], wall_seconds: float) -> dict:
    """The run's summary: CER (Eq. 1), final error, cumulative FLOPs and parameters (Eq. 2)."""
    last = series[-1] if series else {}
    summary = {
        "chunks": len(series),
        "stages": sum(1 for r in series if r.get("trained")),
        "cumulative_train_flops": last.get("cumulative_train_flops", 0),
        "cumulative_parameters": last.get("cumulative_parameters", 0),
        "final_parameters": last.get("parameters"),
        "final_inference_flops_per_example": last.get("inference_flops_per_example"),
        "train_seconds": sum(r.get("train_seconds", 0.0) for r in series),
        "wall_seconds": wall_seconds,
    }
    if any("test_error" in r or "prequential_error" in r for r in series):
        summary["cer"] = last.get("cumulative_error")
        summary["final_test_error"] = last.get("test_error")
        summary["cumulative_prequential_error"] = last.get("cumulative_prequential_error")
    perplexities = [r["test_perplexity"] for r in series if r.get("test_perplexity") is not None]
    if perplexities:
        summary["final_test_perplexity"] = perplexities[-1]
        summary["average_test_perplexity"] = sum(perplexities) / len(perplexities)
    return summary


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(_finite(data), f, indent=1)
    os.replace(tmp, path)


def write_series_csv(path: Path, series: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for record in series:
            writer.writerow({k: "" if record.get(k) is None else record.get(k) for k in CSV_COLUMNS})
    os.replace(tmp, path)


def _finite(value):
    # JSON has no NaN/inf; other tools (jq, browsers) reject them, so they become null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class ResultsWriter(EngineObserver):
    """Keeps ``results.json`` and ``series.csv`` of a run up to date after every step."""

    def __init__(self, folder: str | Path, config: dict, extra: dict | None = None):
        self.folder = Path(folder)
        self.config = config
        self.extra = extra or {}
        self.folder.mkdir(parents=True, exist_ok=True)

    def on_step(self, record: dict, engine: Engine) -> None:
        self.write(engine)

    def write(self, engine: Engine) -> dict:
        series = engine.state.series
        results = {
            "config": self.config,
            "series": series,
            "summary": summarize(series, engine.clock() - engine.state.started_at),
            **self.extra,
        }
        write_json_atomic(self.folder / "results.json", results)
        write_series_csv(self.folder / "series.csv", series)
        return results


def read_results(path: str | Path) -> dict:
    """Read a run's results.json (a folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    return json.loads(path.read_text())
