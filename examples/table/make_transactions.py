"""Writes a synthetic card-transaction history for the backtest example (docs/results.md#backtesting-on-your-own-history).

40,000 transactions over 60 days, written in the order a nightly export lists them (by merchant, not by
time): a ``when`` column of ISO 8601 date-times, a ``merchant`` name (text, so not a feature), 30 numeric
features ``f00``..``f29`` (``f00`` a log-normal amount) and a ``label`` of ``ok`` or ``fraud``, about 2 %
fraud. Fraud is written into a few features, and the fraudsters change their pattern on day 40, so a
model that stops training falls behind. Seeded: every run writes the same file.

    python examples/table/make_transactions.py            # writes runs/data/transactions.csv
    python examples/table/make_transactions.py OUT.csv
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

ROWS = 40_000
DAYS = 60
FEATURES = 30
#: The day the fraud pattern changes.
NEW_PATTERN_DAY = 40
#: The share of fraud the intercept of the fraud score is tuned to.
FRAUD_SHARE = 0.02
MERCHANTS = ("grocer", "fuel", "travel", "online", "pharmacy", "electronics")


def transactions(seed: int = 0) -> dict[str, np.ndarray]:
    """The history's columns, in the export's order."""
    rng = np.random.default_rng(seed)
    seconds = np.sort(rng.uniform(0, DAYS * 86_400, ROWS))
    x = rng.normal(size=(ROWS, FEATURES))
    x[:, 0] = np.exp(3.5 + 1.2 * x[:, 0])  # the amount
    late = seconds >= NEW_PATTERN_DAY * 86_400
    # Before the change, fraud is large amounts with odd f01, f02; after it, small amounts with odd f03..f05.
    early_score = 1.3 * np.log(x[:, 0]) - 4.5 + 1.6 * x[:, 1] - 1.2 * x[:, 2]
    late_score = -0.8 * np.log(x[:, 0]) + 3.0 + 1.5 * x[:, 3] + 1.5 * x[:, 4] - 1.2 * x[:, 5]
    score = np.where(late, late_score, early_score)
    intercept = np.quantile(score, 1 - FRAUD_SHARE)
    fraud = rng.uniform(size=ROWS) < 1 / (1 + np.exp(-4 * (score - intercept)))
    merchant = np.array(MERCHANTS)[rng.integers(0, len(MERCHANTS), ROWS)]
    start = datetime(2026, 1, 1)
    when = np.array([(start + timedelta(seconds=float(s))).isoformat(timespec="seconds") for s in seconds])
    order = np.argsort(merchant, kind="stable")  # the export lists by merchant, not by time
    columns = {"when": when, "merchant": merchant}
    columns |= {f"f{i:02d}": x[:, i].round(4) for i in range(FEATURES)}
    columns["label"] = np.where(fraud, "fraud", "ok")
    return {name: values[order] for name, values in columns.items()}


def write_csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/data/transactions.csv")
    columns = transactions()
    write_csv(out, columns)
    print(f"wrote {out}: {ROWS} transactions, {np.mean(columns['label'] == 'fraud'):.1%} fraud")
