"""The results log of a run: ``results.json`` (config, series, summary) and ``series.csv``.

Written after every step, atomically, so ``alma report`` can read a run that is still going. Each row
of the series is encoded once, when it is new, and ``results.json`` holds one row a line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

from alma_daemon.core.atomic_json import finite, write_text_atomic
from alma_daemon.core.engine import Engine, EngineObserver, EngineState
from alma_daemon.core.records import CUMULATIVE_MEASURES, StageRecord, StepRecord, csv_columns, read_rows
from alma_daemon.observability.measure_words import PAPER_MEASURE, higher_is_better

#: Columns of series.csv, in order; other fields stay in results.json only.
CSV_COLUMNS = csv_columns()


def summarize(series: list[dict], wall_seconds: float, state: EngineState | None = None) -> dict:
    """The run's summary: the CER (Eq. 1) and final error, or the task's measure's
    (:func:`measure_summary`), cumulative FLOPs and parameters (Eq. 2).

    Stages, training FLOPs and seconds come from the running totals, not by counting trained steps:
    a time-based policy's stages between chunks (Engine.on_tick) have no step record of their own.
    The engine's ``state`` holds them up to its last stage; without it, the last record does up to
    its chunk. The rest (final errors, parameters, inference cost) is the last chunk's, measured
    before any stage trained since.
    """
    return summarize_records(read_rows(series), wall_seconds, state)


def summarize_records(records: Sequence[StepRecord], wall_seconds: float, state: EngineState | None = None) -> dict:
    """:func:`summarize` of a series already read."""
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
    if last is not None:
        summary.update(measure_summary(records, last))
    return summary


def measure_summary(records: Sequence[StepRecord], last: StepRecord) -> dict:
    """The task's measure ``m`` at the end of the series: ``final_test_{m}``, ``cumulative_{m}`` (the CER
    of the error rate, also kept as ``cer``), ``cumulative_prequential_{m}``, the last details
    (``final_test_measures``, ``final_prequential_measures``) and ``baseline_{m}``, where recorded. A
    language model's ``final_test_perplexity`` is the last one measured, beside their average."""
    m = last.measure
    summary: dict = {}
    if m == PAPER_MEASURE:
        summary["cer"] = last.cumulative
    if m == "perplexity":
        perplexities = [r.test for r in records if r.measure == m and r.test is not None]
        if perplexities:
            summary["final_test_perplexity"] = perplexities[-1]
            summary["average_test_perplexity"] = sum(perplexities) / len(perplexities)
    else:
        summary[f"final_test_{m}"] = last.test
    summary[f"cumulative_prequential_{m}"] = last.cumulative_prequential
    summary["measure"] = m
    summary["higher_is_better"] = higher_is_better(m)
    if m in CUMULATIVE_MEASURES:
        summary[f"cumulative_{m}"] = last.cumulative
    for name, details in (
        ("final_test_measures", last.test_measures),
        ("final_prequential_measures", last.prequential_measures),
    ):
        if details:
            summary[name] = details
    if last.baseline is not None:
        summary[f"baseline_{m}"] = last.baseline
    return summary


def _csv_text(fields: list) -> str:
    """``fields`` as one CSV line, with its line end."""
    out = io.StringIO()
    csv.writer(out).writerow(fields)
    return out.getvalue()


CSV_HEADER = _csv_text(CSV_COLUMNS)


def csv_line(row: dict) -> str:
    """A series row as a line of series.csv (CSV_COLUMNS; None as an empty field)."""
    return _csv_text(["" if row.get(k) is None else row.get(k) for k in CSV_COLUMNS])


def results_text(results: dict, series_lines: Sequence[str]) -> str:
    """``results.json``'s text, laid out as ``json.dumps(indent=1)`` would but with one row of the series
    a line, given already encoded in ``series_lines``."""
    fields = []
    for key, value in results.items():
        if key == "series":
            text = "[\n  " + ",\n  ".join(series_lines) + "\n ]" if series_lines else "[]"
        else:
            text = json.dumps(finite(value), indent=1).replace("\n", "\n ")
        fields.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


class ResultsWriter(EngineObserver):
    """Keeps ``results.json`` and ``series.csv`` of a run up to date after every step, and after every
    stage trained between chunks.

    A row is encoded (JSON, CSV, record) once, when it is new, so that a step costs the writing of the
    files and not the encoding of the whole series again: on a stream of thousands of chunks that
    encoding was most of the step's time outside training.
    """

    def __init__(self, folder: str | Path, config: dict, extra: dict | None = None):
        self.folder = Path(folder)
        self.config = config
        self.extra = extra or {}
        self.folder.mkdir(parents=True, exist_ok=True)
        #: The rows encoded so far, kept alive so that the identity check in _encode never meets a
        #: reused object id.
        self._rows: list[dict] = []
        self._json_lines: list[str] = []
        self._csv_lines: list[str] = []
        self._records: list[StepRecord] = []

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        self.write(engine)

    def on_tick_stage(self, stage: StageRecord, engine: Engine) -> None:
        self.write(engine)

    def write(self, engine: Engine) -> dict:
        self._encode(engine.state.series)
        results = results_of(engine, self.config, self.extra, records=self._records)
        write_text_atomic(self.folder / "results.json", results_text(results, self._json_lines))
        write_text_atomic(self.folder / "series.csv", CSV_HEADER + "".join(self._csv_lines))
        return results

    def _encode(self, series: list[dict]) -> None:
        """Encode the rows not encoded yet. The engine only appends rows; an engine whose state was
        replaced (restored from its store) holds other row objects, and is encoded again whole."""
        done = len(self._rows)
        if done > len(series) or (done and series[done - 1] is not self._rows[-1]):
            done = 0
            del self._rows[:], self._json_lines[:], self._csv_lines[:], self._records[:]
        for row in series[done:]:
            self._rows.append(row)
            self._json_lines.append(json.dumps(finite(row)))
            self._csv_lines.append(csv_line(row))
            self._records.append(StepRecord.from_row(row))


def results_of(
    engine: Engine, config: dict, extra: dict | None = None, *, records: Sequence[StepRecord] | None = None
) -> dict:
    """What ``results.json`` holds for ``engine``'s run so far: ``config`` (the resolved config, as a
    dict), the series, its summary (wall time on the engine's clock, from its start) and ``extra``.
    ``records``: the series already read, if the caller has it."""
    series = engine.state.series
    wall_seconds = engine.clock() - engine.state.started_at
    return {
        "config": config,
        "series": series,
        "summary": summarize_records(read_rows(series) if records is None else records, wall_seconds, engine.state),
        **(extra or {}),
    }


def read_results(path: str | Path) -> dict:
    """Read a run's results.json (a folder or the file itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    return json.loads(path.read_text())
