"""The task's measure in ``alma report``: which measure a folder's figures show, the table's columns and
notes for what the paper's columns do not hold, and, for a binary task, ``measures_vs_time.png``: the
recall, precision and PR-AUC of the positive class after each chunk.

The paper's runs (the error rate on balanced classes) add nothing here: their table and figures stay
as they were. A team's run adds its measure's columns (``cumulative recall``, ``final test recall``,
...), its input-blind baseline (``baseline recall``) and its other measures at the end of the stream.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from alma_daemon.core.records import StepRecord
from alma_daemon.measures import MEASURES
from alma_daemon.measures.binary import PositiveClassMeasure
from alma_daemon.measures.details import BINARY_DETAILS
from alma_daemon.observability.figures import RunLike, plot_error_curves
from alma_daemon.observability.measure_words import (
    PAPER_MEASURE,
    baseline_model,
    cumulative_words,
    direction,
    served_words,
)
from alma_daemon.observability.served_measure import served_measure, served_reference

#: The measures whose columns every report table has (:data:`alma_daemon.observability.report.TABLE_HEADER`).
PAPER_COLUMNS = ("error", "perplexity")
#: A binary task's measures of its positive class, drawn in :data:`DETAILS_PLOT`.
POSITIVE_CLASS_MEASURES = tuple(name for name in BINARY_DETAILS if issubclass(MEASURES[name], PositiveClassMeasure))
DETAILS_PLOT = ("measures_vs_time.png", "recall, precision and PR-AUC of the positive class vs time")
#: How the details figure names a measure.
_TITLES = {"pr_auc": "PR-AUC"}


def run_measure(run: RunLike) -> str:
    """The measure a run was judged by: its summary's, else its rows' (results written before the
    summary named it), else the paper's."""
    if run.summary.get("measure"):
        return str(run.summary["measure"])
    if run.series:
        return StepRecord.from_row(run.series[-1]).measure
    return PAPER_MEASURE


def folder_measure(runs: Sequence[RunLike]) -> str:
    """The measure a report's figures show: the one most of its runs were judged by (the first such
    run's, on a tie); the table shows every run's."""
    counts = Counter(run_measure(run) for run in runs)
    return counts.most_common(1)[0][0] if counts else PAPER_MEASURE


def measured_sets(runs: Sequence[RunLike], measure: str) -> list[str]:
    """The sets a measure was taken on: test and prequential, or prequential alone for a stream without
    a test set."""
    tested = any(row.get(f"test_{measure}") is not None for run in runs for row in run.series)
    return ["test", "prequential"] if tested else ["prequential"]


def has_baseline(runs: Sequence[RunLike], measure: str) -> bool:
    return any(row.get(f"baseline_{measure}") is not None for run in runs for row in run.series)


def has_reference(runs: Sequence[RunLike], measure: str) -> bool:
    """Whether a run recorded a reference learner's ``measure`` (``reference.kind``, core/reference.py)."""
    return any(row.get(f"reference_{measure}") is not None for run in runs for row in run.series)


@dataclasses.dataclass
class _Flattened:
    """A run whose rows also hold each detail as ``test_<name>`` and ``prequential_<name>``."""

    config: dict[str, Any]
    summary: dict[str, Any]
    series: list[dict[str, Any]]


def flattened(run: RunLike) -> _Flattened:
    rows = []
    for row in run.series:
        flat = dict(row)
        for on in ("test", "prequential"):
            flat.update({f"{on}_{name}": value for name, value in (row.get(f"{on}_measures") or {}).items()})
        rows.append(flat)
    return _Flattened(run.config, run.summary, rows)


def plot_details(runs: Sequence[RunLike], path: Path) -> bool:
    """A binary task's recall, precision and PR-AUC after each chunk, a panel each, on the test set
    (else each chunk, prequential); False, and nothing drawn, where no run measured them."""
    flat = [flattened(run) for run in runs]
    names = [n for n in POSITIVE_CLASS_MEASURES if any(f"prequential_{n}" in row for f in flat for row in f.series)]
    if not names:
        return False
    on = measured_sets(flat, names[0])[0]
    panels = [(f"{on}_{name}", f"{on} {_TITLES.get(name, name)}") for name in names]
    shown = [_TITLES.get(name, name) for name in names]
    what = " and ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
    plot_error_curves(
        flat,
        panels,
        what,
        path,
        axis_label="higher is better",
        title=f"{what[:1].upper()}{what[1:]} of the positive class after each mega-batch",
    )
    return True


def _cell(value: object, measure: str) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if MEASURES[measure].rate else f"{value:.4g}"


def _details(run: RunLike) -> dict[str, Any]:
    """The run's other measures at its end: the test set's, else the last chunk's."""
    return run.summary.get("final_test_measures") or run.summary.get("final_prequential_measures") or {}


def _details_cell(run: RunLike) -> str:
    details = _details(run)
    return ", ".join(f"{name} {'' if value is None else f'{value:.4f}'}" for name, value in details.items())


def _summary_cell(key: str, measure: str) -> Callable[[RunLike], str]:
    return lambda run: _cell(run.summary.get(key), measure)


def _served_cell(
    served: Callable[[Sequence[dict[str, Any]], str], float | None], measure: str
) -> Callable[[RunLike], str]:
    """A run's served ``measure`` (the network's or the reference's) from its rows; empty for a run of another measure."""
    return lambda run: _cell(served(run.series, measure) if run_measure(run) == measure else None, measure)


def measure_columns(runs: Sequence[RunLike]) -> list[tuple[str, Callable[[RunLike], str]]]:
    """The table's columns beyond the paper's: (header, cell of a run) for each other measure's
    cumulative, final and prequential values, each measure's baseline, the served measure of the network
    and of the reference learner where one ran, and the other measures."""
    measures = list(dict.fromkeys(run_measure(run) for run in runs))
    columns: list[tuple[str, Callable[[RunLike], str]]] = []
    for m in (m for m in measures if m not in PAPER_COLUMNS):
        columns += [
            (cumulative_words(m), _summary_cell(f"cumulative_{m}", m)),
            (f"final test {m}", _summary_cell(f"final_test_{m}", m)),
            (f"cumulative prequential {m}", _summary_cell(f"cumulative_prequential_{m}", m)),
        ]
    for m in (m for m in measures if any(run.summary.get(f"baseline_{m}") is not None for run in runs)):
        columns.append((f"baseline {m}", _summary_cell(f"baseline_{m}", m)))
    for m in (m for m in measures if has_reference(runs, m)):
        columns += [
            (served_words(m), _served_cell(served_measure, m)),
            (f"{served_words(m)}, reference", _served_cell(served_reference, m)),
        ]
    if any(_details(run) for run in runs):
        columns.append(("final other measures", _details_cell))
    return columns


def measure_notes(runs: Sequence[RunLike]) -> list[str]:
    """What the table's other measures mean: each one's direction and definition, and its baseline."""
    measures = list(dict.fromkeys(run_measure(run) for run in runs))
    notes = [f"{m}: {direction(m)}; {MEASURES[m].description}." for m in measures if m not in PAPER_COLUMNS]
    notes += [
        f"baseline {m}: the {m} of the {baseline_model(m)}, a model that "
        "ignores its inputs, on the test set (else the last chunk): what a model must beat."
        for m in measures
        if any(run.summary.get(f"baseline_{m}") is not None for run in runs)
    ]
    notes += [
        f"{served_words(m)}: the mean prequential {m} over the stream's second half, what users saw; "
        f"{served_words(m)}, reference: the same of the reference learner, a linear model learnt on the same "
        "chunks (reference.kind); a network that does no better is behind a linear model."
        for m in measures
        if has_reference(runs, m)
    ]
    if any(_details(run) for run in runs):
        notes.append(
            "final other measures: the task's other measures after the last chunk, on the test set (else the chunk)."
        )
    return notes
