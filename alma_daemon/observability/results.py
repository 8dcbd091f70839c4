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
from typing import Any

from alma_daemon.core.atomic_json import finite, write_text_atomic
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.engine_state import EngineState
from alma_daemon.core.records import CUMULATIVE_MEASURES, StageRecord, StepRecord, csv_columns, read_rows
from alma_daemon.observability.measure_words import PAPER_MEASURE, higher_is_better
from alma_daemon.observability.served_measure import judged_mean, longest_untrained

#: Columns of series.csv, in order; other fields stay in results.json only.
CSV_COLUMNS = csv_columns()


def summarize(series: list[dict[str, Any]], wall_seconds: float, state: EngineState | None = None) -> dict[str, Any]:
    """The run's summary: the CER (Eq. 1) and final error, or the task's measure's
    (:func:`measure_summary`), cumulative FLOPs and parameters (Eq. 2).

    Stages, training FLOPs and seconds come from the running totals, not by counting trained steps:
    a time-based policy's stages between chunks (Engine.on_tick) have no step record of their own.
    The engine's ``state`` holds them up to its last stage; without it, the last record does up to
    its chunk. The rest (final errors, parameters, inference cost) is the last chunk's, measured
    before any stage trained since.
    """
    return summarize_records(read_rows(series), wall_seconds, state)


def summarize_records(
    records: Sequence[StepRecord], wall_seconds: float, state: EngineState | None = None
) -> dict[str, Any]:
    """:func:`summarize` of a series already read."""
    last: StepRecord | None = records[-1] if records else None
    # Both carry model_version and the cumulative training FLOPs and seconds.
    totals: EngineState | StepRecord | None = state if state is not None else last
    summary = {
        # A daemon's engine holds its newest rows only; its state counts every chunk.
        "chunks": state.chunks_seen if state is not None else len(records),
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


def measure_summary(records: Sequence[StepRecord], last: StepRecord) -> dict[str, Any]:
    """The task's measure ``m`` at the end of the series: ``final_test_{m}``, ``cumulative_{m}`` (the CER
    of the error rate, also kept as ``cer``), ``cumulative_prequential_{m}``, the last details
    (``final_test_measures``, ``final_prequential_measures``) and ``baseline_{m}``, where recorded. A
    language model's ``final_test_perplexity`` is the last one measured, beside their average.

    What an endless stream's users saw (observability/served_measure.py): ``served_{m}``, the mean
    prequential measure over the series' second half, and ``longest_wait_chunks``, the most chunks in a
    row without a stage. Where a reference learner ran beside the network (``reference.kind``):
    ``served_reference_{m}`` and ``cumulative_reference_{m}``, its measures on the same chunks."""
    m = last.measure
    summary: dict[str, Any] = {}
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
    served = judged_mean([r.prequential if r.measure == m else None for r in records])
    if served is not None:
        summary[f"served_{m}"] = served
    # The reference learner's, beside the network's (core/reference.py), where the steps recorded one.
    if last.cumulative_reference is not None:
        summary[f"cumulative_reference_{m}"] = last.cumulative_reference
    served_reference = judged_mean([r.reference if r.measure == m else None for r in records])
    if served_reference is not None:
        summary[f"served_reference_{m}"] = served_reference
    summary["longest_wait_chunks"] = longest_untrained(
        [r.trained for r in records], [r.model_age_chunks for r in records]
    )
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


def _csv_text(fields: list[Any]) -> str:
    """``fields`` as one CSV line, with its line end."""
    out = io.StringIO()
    csv.writer(out).writerow(fields)
    return out.getvalue()


CSV_HEADER = _csv_text(CSV_COLUMNS)


def csv_line(row: dict[str, Any]) -> str:
    """A series row as a line of series.csv (CSV_COLUMNS; None as an empty field)."""
    return _csv_text(["" if row.get(k) is None else row.get(k) for k in CSV_COLUMNS])


def results_text(results: dict[str, Any], series_lines: Sequence[str]) -> str:
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


#: The daemon's full series, one JSON row a line, beside its results.json (which holds the newest rows).
HISTORY_FILE = "series.jsonl"


class ResultsWriter(EngineObserver):
    """Keeps ``results.json`` and ``series.csv`` of a run up to date after every step, and after every
    stage trained between chunks.

    A row is encoded (JSON, CSV, record) once, when it is new, so that a step costs the writing of the
    files and not the encoding of the whole series again: on a stream of thousands of chunks that
    encoding was most of the step's time outside training.

    With ``history`` (the daemon, whose engine holds the newest ``daemon.series_rows`` rows only),
    ``results.json`` holds the rows the engine holds and names :data:`HISTORY_FILE`, to which, as to
    ``series.csv``, each new row is appended: a step writes as much on the stream's first day as in
    its second year. :meth:`resume` cuts both files back to the committed series after a restart.
    """

    def __init__(
        self,
        folder: str | Path,
        config: dict[str, Any],
        extra: dict[str, Any] | None = None,
        *,
        history: bool = False,
        notes: dict[str, Any] | None = None,
    ):
        self.folder = Path(folder)
        self.config = config
        self.extra = extra or {}
        #: What reading the data left out (:attr:`SimulatedStream.notes`), added to the summary.
        self.notes = notes or {}
        self.history = history
        self.folder.mkdir(parents=True, exist_ok=True)
        #: The rows encoded so far, kept alive so that the identity check in _encode never meets a
        #: reused object id.
        self._rows: list[dict[str, Any]] = []
        self._json_lines: list[str] = []
        self._csv_lines: list[str] = []
        self._records: list[StepRecord] = []

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        self.write(engine)

    def on_tick_stage(self, stage: StageRecord, engine: Engine) -> None:
        self.write(engine)

    def resume(self, engine: Engine) -> None:
        """The engine was restored from its committed state: the history files are made to end with its
        last row. Rows after it (a step that never committed) are cut; committed rows they lack (appended
        after the files' last sync when the machine went down) are appended from the engine's rows; a
        folder written before the history files is given them, from its ``results.json``."""
        series = engine.state.series
        self._encode(series)
        last = series[-1]["t"] if series else 0
        history, csv_file = self.folder / HISTORY_FILE, self.folder / "series.csv"
        if not history.exists():
            self._start_history(history, last)
        truncate_rows_after(history, last)
        written = last_row_t(history)
        missing = [line for row, line in zip(self._rows, self._json_lines, strict=True) if row["t"] > written]
        append_lines(history, missing)
        if _first_line(csv_file) != CSV_HEADER:
            # Older columns, or none: the CSV is written again from the history, under today's header.
            rows = read_history(history)
            write_text_atomic(csv_file, CSV_HEADER + "".join(csv_line(row) for row in rows))
        truncate_rows_after(csv_file, last)

    def _start_history(self, history: Path, last: int) -> None:
        """The rows an older daemon kept in ``results.json`` (its whole series) begin the history."""
        try:
            rows = json.loads((self.folder / "results.json").read_text()).get("series") or []
        except (OSError, ValueError):
            rows = []
        append_lines(history, [json.dumps(finite(row)) for row in rows if row.get("t", 0) <= last])
        history.touch()

    def write(self, engine: Engine) -> dict[str, Any]:
        new = self._encode(engine.state.series)
        results = results_of(engine, self.config, self.extra, records=self._records, notes=self.notes)
        if self.history:
            results["series_file"] = HISTORY_FILE
            append_lines(self.folder / HISTORY_FILE, self._json_lines[len(self._json_lines) - new :] if new else [])
            csv_file = self.folder / "series.csv"
            header = [] if csv_file.exists() and csv_file.stat().st_size else [CSV_HEADER]
            append_lines(csv_file, header + (self._csv_lines[len(self._csv_lines) - new :] if new else []))
        write_text_atomic(self.folder / "results.json", results_text(results, self._json_lines))
        if not self.history:
            write_text_atomic(self.folder / "series.csv", CSV_HEADER + "".join(self._csv_lines))
        return results

    def _encode(self, series: list[dict[str, Any]]) -> int:
        """Encode the rows not encoded yet; return how many. The engine appends rows, and a daemon's
        drops its oldest (``t`` counts them, one a step); an engine whose state was replaced (restored
        from its store) holds other row objects, and is encoded again whole."""
        first = series[0]["t"] if series else 0
        while self._rows and self._rows[0]["t"] < first:
            for held in (self._rows, self._json_lines, self._csv_lines, self._records):
                del held[0]
        done = len(self._rows)
        if done > len(series) or (done and series[done - 1] is not self._rows[-1]):
            done = 0
            del self._rows[:], self._json_lines[:], self._csv_lines[:], self._records[:]
        for row in series[done:]:
            self._rows.append(row)
            self._json_lines.append(json.dumps(finite(row)))
            self._csv_lines.append(csv_line(row))
            self._records.append(StepRecord.from_row(row))
        return len(series) - done


def append_lines(path: Path, lines: Sequence[str]) -> None:
    """Append ``lines`` (JSON rows without their newline, or CSV lines with it) to ``path``."""
    if not lines:
        return
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
        out.flush()


def truncate_rows_after(path: Path, last_t: int) -> None:
    """Cut ``path`` (series.jsonl or series.csv, rows in ``t`` order) after the row of step ``last_t``,
    reading from its end only: rows after it are steps a crash kept from committing, and a row
    half written is one of them."""
    if not path.exists():
        return
    with path.open("rb+") as file:
        end = file.seek(0, 2)
        start, text = end, b""
        lines: list[bytes] = []
        while start > 0:
            size = min(1 << 16, start)
            start -= size
            file.seek(start)
            text = file.read(size) + text
            lines = text.split(b"\n")
            begins, offset = [], start
            for line in lines:
                begins.append(offset)
                offset += len(line) + 1
            # The last piece is a line cut short (or empty, after the final newline): never a row. Unless
            # the file's start was read, the first piece may be the end of a longer line.
            for i in range(len(lines) - 2, 0 if start else -1, -1):
                t = _row_t(lines[i])
                if t is not None and t <= last_t:
                    file.truncate(min(end, begins[i] + len(lines[i]) + 1))
                    return
        # No row at or before last_t: a CSV keeps its header only.
        header = lines[0] if lines and lines[0].startswith(b"t,") else None
        file.truncate(len(header) + 1 if header is not None else 0)


def _first_line(path: Path) -> str | None:
    if not path.exists():
        return None
    with path.open(encoding="utf-8", newline="") as file:
        return file.readline()


def last_row_t(path: Path) -> int:
    """The step ``t`` of the last whole row of a history file (0 without one)."""
    with path.open("rb") as file:
        end = file.seek(0, 2)
        file.seek(max(0, end - (1 << 16)))
        lines = file.read().split(b"\n")
    for line in reversed(lines[:-1]):
        t = _row_t(line)
        if t is not None:
            return t
    return 0


def _row_t(line: bytes) -> int | None:
    """The step ``t`` of a series.jsonl or series.csv line; None for a header or a partial line."""
    line = line.strip()
    if not line:
        return None
    try:
        if line.startswith(b"{"):
            return int(json.loads(line)["t"])
        return int(line.split(b",", 1)[0])
    except (ValueError, KeyError):
        return None


def results_of(
    engine: Engine,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
    *,
    records: Sequence[StepRecord] | None = None,
    notes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``results.json`` holds for ``engine``'s run so far: ``config`` (the resolved config, as a
    dict), the series, its summary (wall time on the engine's clock, from its start; ``notes``, what
    reading the data left out, added to it) and ``extra``. ``records``: the series already read, if the
    caller has it."""
    series = engine.state.series
    wall_seconds = engine.clock() - engine.state.started_at
    summary = summarize_records(read_rows(series) if records is None else records, wall_seconds, engine.state)
    return {"config": config, "series": series, "summary": summary | (notes or {}), **(extra or {})}


def read_results(path: str | Path) -> dict[str, Any]:
    """Read a run's results.json (a folder or the file itself); a daemon's, whose results.json holds the
    newest rows, with its whole series from the history file it names."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    results: dict[str, Any] = json.loads(path.read_text())
    history = results.pop("series_file", None)
    if history is not None and (path.parent / history).exists():
        results["series"] = read_history(path.parent / history)
        records = read_rows(results["series"])
        if records:
            # The summary written beside the newest rows covered those only; its series' part is redone.
            results["summary"].update(measure_summary(records, records[-1]), chunks=len(records))
    return results


def read_history(path: Path) -> list[dict[str, Any]]:
    """The rows of a daemon's series.jsonl; a row half written by a crash, not committed, is left out."""
    rows = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows
