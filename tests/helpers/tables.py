"""A small team history for the table tests (tests/test_table.py, tests/test_history_time.py): a shuffled
CSV with a time column, a text column and a rare label, and the config that reads it."""

from __future__ import annotations

import csv
import typing
from pathlib import Path

import numpy as np

from alma_daemon.config import build_config

ROWS = 200
FEATURES = 4


def history(rows: int = ROWS, seed: int = 0) -> dict[str, list]:
    """A shuffled history: ``step`` is its time (also a feature, so the order shows in ``x``), a
    text column that is not a feature, and a rare ``fraud`` label that the first feature predicts."""
    rng = np.random.default_rng(seed)
    step = rng.permutation(rows)
    x = rng.normal(size=(rows, FEATURES - 1)).round(3)
    fraud = x[:, 0] > 1.2
    return {
        "when": [f"2024-03-{1 + s // 24:02d}T{s % 24:02d}:00:00" for s in step],
        "merchant": ["acme" if s % 3 else "zeta" for s in step],
        "step": list(step),
        **{f"f{i}": list(x[:, i]) for i in range(FEATURES - 1)},
        "label": ["fraud" if f else "ok" for f in fraud],
    }


def write_csv(path: Path, columns: dict[str, list]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))
    return path


def table_config(files, *, megabatches: int = 3, task: dict | None = None, **dataset) -> typing.Any:
    return build_config(
        {
            "dataset": {
                "name": "table",
                "files": [str(f) for f in files] if isinstance(files, list) else str(files),
                "label_column": "label",
                "time_column": "when",
                **dataset,
            },
            "task": {"classes": ["ok", "fraud"], **(task or {})},
            "stream": {"megabatches": megabatches, "seed": 0},
        }
    )
