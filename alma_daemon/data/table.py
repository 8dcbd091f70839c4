"""A team's own history as a stream (``dataset.name: table``): the rows of ``.csv``, ``.parquet`` or
``.npz`` files, one labeled example a row.

The history (``dataset.files``, concatenated in the order given) is put in time order by
``dataset.time_column`` (a stable sort: rows of one time keep their order in the files; unset: the
files' order). Its last ``dataset.test_fraction`` is held out as the test set, unless
``dataset.test_file`` gives one: as a River stream's continuation, it measures every step's model on
the most recent data. The rest arrives as ``stream.megabatches`` contiguous chunks in time order, so a
backtest sees the history as it happened, never a future row before a past one. With a time column each chunk
carries its time, that of its newest row (:meth:`TableData.chunk_time`), which its step records as
``chunk_time`` (docs/results.md), so that a report draws the model's age in the history's time.

Both front doors read the table through :func:`read_table` (``alma simulate`` for the chunks, the
daemon's task reader for the task and test set, ``alma replay`` for the chunks it sends), so
``alma run`` on the same config measures on the same test set.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alma_daemon.config import Config, ConfigError, DatasetConfig
from alma_daemon.data.datasets import DatasetError, TaskInfo
from alma_daemon.data.declared_task import declared_kind
from alma_daemon.data.streams import ChunkTime
from alma_daemon.data.tensors import LabeledData

log = logging.getLogger(__name__)

#: Share of the ordered history held out as the test set when ``dataset.test_fraction`` is unset.
DEFAULT_TEST_FRACTION = 0.1
#: Column names listed in a message about a missing column, at most.
LISTED_COLUMNS = 12

#: A file's columns by name, in the file's order (strings from a CSV; Parquet's own types).
Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class TableData:
    """A table stream: its task, the history that arrives as chunks (in time order), the test set."""

    task: TaskInfo
    train: LabeledData
    test: LabeledData
    #: Rows of the files left out for a missing feature cell (``dataset.missing: drop``), test set included.
    rows_dropped: int = 0
    #: Columns of text the features leave out (the config names no features).
    text_columns: tuple[str, ...] = ()
    #: The time of each row of :attr:`train` (seconds since the epoch for date-times, else the numbers
    #: as written), in the rows' order; None without ``dataset.time_column`` (or an npz's ``t``).
    train_times: np.ndarray | None = None
    #: "date-time" or "number"; None without a time.
    time_kind: str | None = None

    def notes(self) -> dict[str, Any]:
        """What reading the history left out, for the results' summary: ``rows_dropped``, ``text_columns``."""
        return {"rows_dropped": self.rows_dropped, "text_columns": list(self.text_columns)}

    def chunk_time(self, start: int, end: int) -> ChunkTime | None:
        """The time of the chunk of :attr:`train`'s rows ``start`` to ``end - 1``: its newest row's, as ISO
        8601 text in UTC for date-times (``2024-03-04T23:00:00+00:00``), as the number for numbers; None
        for a history without a time."""
        if self.train_times is None or end <= start:
            return None
        return time_text(float(self.train_times[start:end].max()), self.time_kind)


@dataclass(frozen=True)
class Rows:
    """One file's rows as read: features (float32, N x F), labels as written, times as sort keys."""

    path: Path
    features: tuple[str, ...]
    x: np.ndarray
    labels: np.ndarray
    #: Seconds since the epoch (date-times) or the numbers as written; None: no time.
    times: np.ndarray | None
    #: "date-time" or "number" (None: no time): files of one history must agree.
    time_kind: str | None
    #: Rows left out for a missing feature cell (``dataset.missing: drop``).
    dropped: int = 0
    #: Columns of text left out of the features (no cell a number), when the config names none.
    text_columns: tuple[str, ...] = ()


def read_table(config: Config) -> TableData:
    """The history and test set ``config.dataset`` names, as one task; a column that is missing or
    not numeric, or a label that does not fit the task, is refused naming its key and its file."""
    dataset = config.dataset
    history = [read_rows(Path(name).expanduser(), dataset) for name in dataset.files]
    held_out = (
        read_rows(Path(dataset.test_file).expanduser(), dataset, "dataset.test_file") if dataset.test_file else None
    )
    files = history + ([held_out] if held_out is not None else [])
    check_alike(files)
    kind = declared_kind(config.task)
    targets = [decode_labels(rows, kind, config) for rows in files]
    num_classes = 1 if kind == "regression" else class_count(files, targets, config)
    features = list(files[0].features)
    task = TaskInfo(kind, (len(features),), num_classes, normalization="standardize", extra={"features": features})
    train, times = in_time_order(history, targets[: len(history)])
    dropped, text_columns = sum(rows.dropped for rows in files), files[0].text_columns
    time_kind = files[0].time_kind
    if files[0].text_columns:
        log.warning(
            "dataset.feature_columns: the features leave out %s of %s, not one cell a number; name the features to "
            "choose them",
            ", ".join(repr(name) for name in files[0].text_columns),
            files[0].path.name,
        )
    if held_out is not None:
        test, _ = in_time_order([held_out], targets[-1:])
        return TableData(task, train, test, dropped, text_columns, times, time_kind)
    test_length = held_out_length(len(train), dataset.test_fraction or DEFAULT_TEST_FRACTION, dataset)
    cut = len(train) - test_length
    test = train.subset(torch.arange(cut, len(train)))
    kept_times = times[:cut] if times is not None else None
    return TableData(task, train.subset(torch.arange(cut)), test, dropped, text_columns, kept_times, time_kind)


def held_out_length(examples: int, fraction: float, dataset: DatasetConfig) -> int:
    """Examples the test set takes from the end of a history of ``examples`` rows (at least one)."""
    length = max(1, math.floor(examples * fraction))
    if length >= examples:
        raise DatasetError(
            f"dataset.test_fraction: a history of {examples} rows leaves none to stream once {length} are "
            f"held out for the test set ({', '.join(dataset.files)})"
        )
    return length


def in_time_order(files: list[Rows], targets: list[np.ndarray]) -> tuple[LabeledData, np.ndarray | None]:
    """The rows of ``files`` concatenated, stably sorted by their times where they have some, and
    their times in that order (None without)."""
    x = np.concatenate([rows.x for rows in files])
    y = np.concatenate(targets)
    times = None
    if files[0].times is not None:
        times = np.concatenate([rows.times for rows in files if rows.times is not None])
        order = np.argsort(times, kind="stable")
        x, y, times = x[order], y[order], times[order]
    data = LabeledData(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)))
    return data, times


def time_text(value: float, kind: str | None) -> ChunkTime:
    """A time as a chunk carries it: ISO 8601 text in UTC for a date-time (seconds since the epoch), the
    number itself otherwise (an integer where it is one)."""
    if kind == "date-time":
        return datetime.fromtimestamp(value, tz=timezone.utc).isoformat()
    return int(value) if value == round(value) and abs(value) < 2**53 else value


def check_alike(files: list[Rows]) -> None:
    """Every file of a stream must give the same features and the same kind of time."""
    first = files[0]
    for rows in files[1:]:
        if rows.features != first.features:
            raise DatasetError(
                f"dataset.feature_columns: {rows.path.name} gives features {list(rows.features)}, "
                f"{first.path.name} gives {list(first.features)}; name the features in dataset.feature_columns"
            )
        if rows.time_kind != first.time_kind:
            raise DatasetError(
                f"dataset.time_column: {rows.path.name} has {rows.time_kind or 'no'} times, "
                f"{first.path.name} has {first.time_kind or 'no'} times; one history needs one kind"
            )


# -- labels -----------------------------------------------------------------------------------------
def decode_labels(rows: Rows, kind: str, config: Config) -> np.ndarray:
    """The targets of ``rows``: float32 numbers for a regression; int64 class indexes otherwise,
    from integers or from the names ``task.classes`` lists."""
    where = f"{label_source(rows, config.dataset)} of {rows.path.name}"
    numbers = as_numbers(rows.labels)
    if kind == "regression":
        if numbers is None and config.task.kind is None:
            # The measure made it a regression: it is the key to change, not the column.
            raise DatasetError(
                f"task.measure: {config.task.measure} judges a regression, but {where} holds class names "
                f"({first_non_number(rows.labels)}); choose a classifier's measure, or a label column of numbers"
            )
        if numbers is None:
            raise DatasetError(
                f"dataset.label_column: {where} is not a number ({first_non_number(rows.labels)}); a regression's "
                "target is a number"
            )
        require_finite(numbers, where, "dataset.label_column", "targets")
        return numbers.astype(np.float32)
    if numbers is not None:
        require_finite(numbers, where, "dataset.label_column", "labels")
        bad = np.flatnonzero((numbers < 0) | (numbers != np.round(numbers)))
        if bad.size:
            raise DatasetError(
                f"dataset.label_column: {where} holds {numbers[bad[0]]:g} (data row {bad[0] + 1}), not a class "
                "index; labels are integers from 0, or names listed in task.classes (set task.kind: regression "
                "for a number to predict)"
            )
        return numbers.astype(np.int64)
    classes = config.task.classes
    names = np.array(["" if value is None else str(value).strip() for value in rows.labels])
    found, index = np.unique(names, return_inverse=True)
    if not classes:
        shown = ", ".join(repr(str(name)) for name in found[:4])
        raise DatasetError(
            f"dataset.label_column: {where} holds class names ({shown}{', ...' if len(found) > 4 else ''}); "
            "list them in task.classes, in label-index order"
        )
    unknown = [name for name in found if name not in classes]
    if unknown:
        raise DatasetError(
            f"dataset.label_column: {str(unknown[0])!r} in {where} is not among task.classes ({', '.join(classes)})"
        )
    return np.array([classes.index(name) for name in found], dtype=np.int64)[index]


def class_count(files: list[Rows], targets: list[np.ndarray], config: Config) -> int:
    """The task's classes: as many as ``task.classes`` names, else ``dataset.num_classes``, else the
    largest label plus one over every file (at least two)."""
    declared = len(config.task.classes) or config.dataset.num_classes
    if declared is None:
        return max(2, 1 + max(int(y.max()) for y in targets))
    for rows, y in zip(files, targets):
        if len(y) and int(y.max()) >= declared:
            key = "task.classes" if config.task.classes else "dataset.num_classes"
            raise DatasetError(
                f"dataset.label_column: label {int(y.max())} in {rows.path.name} is outside the {declared} "
                f"classes of {key}"
            )
    return declared


def label_source(rows: Rows, dataset: DatasetConfig) -> str:
    return "array y" if rows.path.suffix == ".npz" else f"column {dataset.label_column!r}"


# -- columns ----------------------------------------------------------------------------------------
def as_numbers(values: np.ndarray) -> np.ndarray | None:
    """``values`` as float64 (an empty cell or a null is NaN); None where one of them is not a number."""
    if values.dtype.kind in "biuf":
        return values.astype(np.float64)
    if values.dtype.kind not in "OUS":
        return None  # date-times, durations
    if values.dtype.kind == "O":
        values = np.array(["" if value is None else str(value) for value in values])
    text = np.char.strip(values.astype(str))
    text = np.where(text == "", "nan", text)
    try:
        return text.astype(np.float64)
    except ValueError:
        return None


def first_non_number(values: np.ndarray) -> str:
    """Where ``values`` first holds something that is not a number, for a message: ``'n/a' in data row 3``."""
    for row, value in enumerate(values, start=1):
        try:
            float("nan" if value is None else str(value).strip() or "nan")
        except ValueError:
            return f"{str(value)!r} in data row {row}"
    return "no number"


def parse_cells(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as float64, NaN where a cell is empty, null or not a number, beside the mask of the
    cells that hold text which is not a number (``'n/a'``, ``'?'``)."""
    numbers = as_numbers(values)
    if numbers is not None:
        return numbers, np.zeros(len(values), dtype=bool)
    if values.dtype.kind not in "OUS":
        return np.full(len(values), np.nan), np.ones(len(values), dtype=bool)
    text = np.char.strip(np.array(["" if value is None else str(value) for value in values]))
    numbers = np.full(len(values), np.nan)
    not_number = np.zeros(len(values), dtype=bool)
    for row, cell in enumerate(text):
        try:
            numbers[row] = float(cell or "nan")
        except ValueError:
            not_number[row] = True
    return numbers, not_number


def require_finite(numbers: np.ndarray, where: str, key: str, what: str) -> None:
    bad = np.flatnonzero(~np.isfinite(numbers))
    if bad.size:
        raise DatasetError(
            f"{key}: {where} has {bad.size} missing or non-finite {what} (first in data row {bad[0] + 1})"
        )


def column(columns: Columns, name: str, key: str, path: Path) -> np.ndarray:
    if name not in columns:
        names = list(columns)
        shown = ", ".join(names[:LISTED_COLUMNS]) + (", ..." if len(names) > LISTED_COLUMNS else "")
        raise DatasetError(f"{key}: no column {name!r} in {path.name} (its columns: {shown})")
    return columns[name]


def rows_of_columns(path: Path, columns: Columns, dataset: DatasetConfig) -> Rows:
    """A CSV's or a Parquet file's rows: the label, time and feature columns ``dataset.*`` names."""
    assert dataset.label_column is not None  # DatasetConfig requires it for a .csv or .parquet table
    labels = column(columns, dataset.label_column, "dataset.label_column", path)
    times, time_kind = None, None
    if dataset.time_column is not None:
        values = column(columns, dataset.time_column, "dataset.time_column", path)
        times, time_kind = as_times(values, f"column {dataset.time_column!r} of {path.name}")
    features, text_columns = feature_columns(path, columns, dataset)
    x = np.stack(list(features.values()), axis=1)
    rows = Rows(path, tuple(features), x, labels, times, time_kind, text_columns=text_columns)
    return with_missing_cells_handled(rows, dataset)


def feature_columns(
    path: Path, columns: Columns, dataset: DatasetConfig
) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The features as float64 columns (NaN where a cell is missing), beside the text columns left out:
    the columns ``dataset.feature_columns`` names, else every column but the label and the time, in the
    file's order, less those of text (not one cell a number: a merchant's name, an id written as text).

    A column of numbers with a cell of text (``'n/a'``) is refused under ``dataset.missing: refuse``,
    naming the cell and its row; otherwise that cell is missing, as an empty one is."""
    named = bool(dataset.feature_columns)
    skipped = (dataset.label_column, dataset.time_column)
    names = dataset.feature_columns if named else [name for name in columns if name not in skipped]
    chosen, text_columns = {}, []
    for name in names:
        values = column(columns, name, "dataset.feature_columns", path)
        numbers, not_number = parse_cells(values)
        if not_number.any() and np.isnan(numbers).all():
            if named:
                raise DatasetError(
                    f"dataset.feature_columns: column {name!r} of {path.name} is not numeric "
                    f"({first_non_number(values)})"
                )
            text_columns.append(name)
            continue
        if not_number.any() and dataset.missing == "refuse":
            row = int(np.flatnonzero(not_number)[0])
            raise DatasetError(
                f"dataset.missing: column {name!r} of {path.name} holds {str(values[row]).strip()!r} in data row "
                f"{row + 1} ({int(not_number.sum())} of {len(values)} cells are not numbers); set dataset.missing: "
                "drop or fill to take such cells as missing, or leave the column out of dataset.feature_columns"
            )
        chosen[name] = numbers
    if not chosen:
        raise DatasetError(f"dataset.feature_columns: {path.name} has no numeric column besides the label and time")
    return chosen, tuple(text_columns)


def with_missing_cells_handled(rows: Rows, dataset: DatasetConfig) -> Rows:
    """``rows`` with its missing or non-finite feature cells as ``dataset.missing`` says: refused (naming
    the first, its column and row), their rows dropped (counted in ``Rows.dropped``), or filled."""
    missing = ~np.isfinite(rows.x)
    if not missing.any():
        return dataclasses.replace(rows, x=rows.x.astype(np.float32))
    row, feature = (int(i) for i in np.argwhere(missing)[0])
    first = f"column {rows.features[feature]!r}, data row {row + 1}"
    if dataset.missing == "refuse":
        raise DatasetError(
            f"dataset.missing: {rows.path.name} has {int(missing.sum())} missing or non-finite feature cells (first: "
            f"{first}); set dataset.missing: drop or fill to accept them"
        )
    if dataset.missing == "fill":
        assert dataset.fill_value is not None  # DatasetConfig requires it with fill
        return dataclasses.replace(rows, x=np.where(missing, dataset.fill_value, rows.x).astype(np.float32))
    kept = ~missing.any(axis=1)
    if not kept.any():
        raise DatasetError(
            f"dataset.missing: every row of {rows.path.name} has a missing feature cell (first: {first})"
        )
    log.warning(
        "dataset.missing: dropped %d of %d rows of %s for a missing feature cell (first: %s)",
        len(kept) - int(kept.sum()),
        len(kept),
        rows.path.name,
        first,
    )
    times = rows.times[kept] if rows.times is not None else None
    return dataclasses.replace(
        rows,
        x=rows.x[kept].astype(np.float32),
        labels=rows.labels[kept],
        times=times,
        dropped=len(kept) - int(kept.sum()),
    )


def as_times(values: np.ndarray, where: str) -> tuple[np.ndarray, str]:
    """Times (of ``where``, for messages) as sort keys: their numbers, or their date-times (ISO 8601
    text, numpy or Parquet timestamps) as seconds since the epoch; a date-time without a zone is UTC."""
    numbers = as_numbers(values)
    if numbers is not None:
        require_finite(numbers, where, "dataset.time_column", "times")
        return numbers, "number"
    if values.dtype.kind == "M":
        missing = np.flatnonzero(np.isnat(values))
        if missing.size:
            raise DatasetError(f"dataset.time_column: {where} has missing times (first in data row {missing[0] + 1})")
        return values.astype("datetime64[ns]").astype(np.int64) / 1e9, "date-time"
    seconds = np.empty(len(values))
    for row, value in enumerate(values):
        try:
            moment = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise DatasetError(
                f"dataset.time_column: {where} holds {str(value)!r} (data row {row + 1}), neither a number nor an "
                "ISO 8601 date-time"
            ) from None
        seconds[row] = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    return seconds, "date-time"


# -- files ------------------------------------------------------------------------------------------
def read_csv(path: Path, dataset: DatasetConfig) -> Rows:
    """A CSV file (``.csv``, or gzipped ``.csv.gz``) with a header row naming its columns."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        records = [record for record in reader if record]
    if not header:
        raise DatasetError(f"{path}: empty; a table starts with a header row naming its columns")
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise DatasetError(f"{path}: column {duplicated[0]!r} appears twice in the header")
    if not records:
        raise DatasetError(f"{path}: a header but no rows")
    for row, record in enumerate(records, start=1):
        if len(record) != len(header):
            raise DatasetError(f"{path}: data row {row} has {len(record)} fields, the header {len(header)}")
    cells = np.array(records, dtype=str)
    return rows_of_columns(path, {name: cells[:, i] for i, name in enumerate(header)}, dataset)


def read_parquet(path: Path, dataset: DatasetConfig) -> Rows:
    """A Parquet file, read with pyarrow (the ``table`` extra)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow: pip install 'alma-daemon[table]'") from None
    table = pq.read_table(path)
    if table.num_rows == 0:
        raise DatasetError(f"{path}: no rows")
    return rows_of_columns(path, {name: table.column(name).to_numpy() for name in table.column_names}, dataset)


def read_npz(path: Path, dataset: DatasetConfig) -> Rows:
    """An ``.npz`` of arrays ``x`` (N x features, numeric), ``y`` (N labels) and optionally ``t`` (N
    times, which order the history as a time column does); read with ``allow_pickle=False``."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            missing = {"x", "y"} - set(arrays.files)
            if missing:
                raise DatasetError(f"{path}: needs arrays x and y; missing {sorted(missing)} (found {arrays.files})")
            x, y = arrays["x"], arrays["y"]
            t = arrays["t"] if "t" in arrays.files else None
    except ValueError as error:  # an object array, which only unpickling could read
        raise DatasetError(f"{path}: {error}") from None
    if x.ndim != 2 or x.dtype.kind not in "biuf":
        raise DatasetError(
            f"{path}: x must be a numeric N x features array; got {x.dtype} {x.shape} (images: dataset.name arrays)"
        )
    for name, values in (("y", y), ("t", t)):
        if values is not None and values.shape != (len(x),):
            raise DatasetError(f"{path}: {name} must hold one value per row of x ({len(x)}); got shape {values.shape}")
    times, time_kind = (None, None) if t is None else as_times(t, f"array t of {path.name}")
    features = tuple(f"x{i}" for i in range(x.shape[1]))
    return with_missing_cells_handled(Rows(path, features, x.astype(np.float64), y, times, time_kind), dataset)


#: A table file's ending -> its reader.
TABLE_FORMATS: dict[str, Callable[[Path, DatasetConfig], Rows]] = {
    ".csv": read_csv,
    ".csv.gz": read_csv,
    ".parquet": read_parquet,
    ".npz": read_npz,
}


def read_rows(path: Path, dataset: DatasetConfig, key: str = "dataset.files") -> Rows:
    """One table file's rows (``key`` names it), read by the reader of its ending."""
    reader = next((read for ending, read in TABLE_FORMATS.items() if path.name.endswith(ending)), None)
    if reader is None:
        raise ConfigError(f"{key}: {path.name} is not a table; give .csv, .csv.gz, .parquet or .npz files")
    if not path.is_file():
        raise DatasetError(f"{key}: {path} not found")
    return reader(path, dataset)
