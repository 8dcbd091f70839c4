"""Writes a synthetic card-transaction history for the backtest example (docs/results.md#backtesting-on-your-own-history).

40,000 transactions over 60 days, written in the order a nightly export lists them (by merchant, not by
time): a ``when`` column of ISO 8601 date-times, a ``merchant`` name (text, so not a feature), 30 numeric
features ``f00``..``f29`` (``f00`` a log-normal amount) and a ``label`` of ``ok`` or ``fraud``, about 2 %
fraud. Fraud is written into a few features, and the fraudsters change their pattern on day 40, so a
model that stops training falls behind. Seeded: every run writes the same file.

``--rare`` writes a harder history instead (:func:`rare_fraud_transactions`, benchmarks/bench_fraud.py):
30,000 transactions over 60 days, 12 skewed features ``f00``..``f11`` (log-normal and exponential ones
among normal ones), about 0.7 % fraud, a new fraud rule from day 30, and the rows shuffled (no order at
all: the ``when`` column orders them).

    python examples/table/make_transactions.py            # writes runs/data/transactions.csv
    python examples/table/make_transactions.py OUT.csv
    python examples/table/make_transactions.py --rare     # writes runs/data/transactions-rare.csv
    python examples/table/make_transactions.py --rare --seed 3 OUT.csv
"""

from __future__ import annotations

import argparse
import csv
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


#: The rare-fraud preset (``--rare``): rows, days, features, the day the fraud rule changes, the fraud share.
RARE_ROWS = 30_000
RARE_DAYS = 60
RARE_FEATURES = 12
RARE_NEW_RULE_DAY = 30
RARE_FRAUD_SHARE = 0.007
#: How steeply a row's chance of fraud rises with its rule's score (larger: fewer frauds off the rule).
RARE_STEEPNESS = 3.0


def rare_fraud_transactions(seed: int = 0) -> dict[str, np.ndarray]:
    """The rare-fraud history's columns, shuffled: ``when``, ``f00``..``f11`` and ``label``.

    ``f00`` is a log-normal amount, ``f01`` an exponential distance from home (km), ``f02`` a log-normal
    count of the card's transactions that day, ``f03`` an exponential time since the card's last
    transaction (minutes); ``f04``..``f11`` are normal. Before day 30 fraud is large amounts far from
    home with a high f04; from day 30 on it is small amounts in quick succession (small f03), many that
    day, with odd f05, f06. Each period's intercept is set so that about 0.7 % of its rows are fraud;
    fraud is drawn from a steep logistic of the rule's score, so a few frauds do not fit the rule."""
    rng = np.random.default_rng(seed)
    seconds = rng.uniform(0, RARE_DAYS * 86_400, RARE_ROWS)
    x = rng.normal(size=(RARE_ROWS, RARE_FEATURES))
    x[:, 0] = np.exp(3.5 + 1.1 * x[:, 0])  # the amount
    x[:, 1] = rng.exponential(20.0, RARE_ROWS)  # km from home
    x[:, 2] = np.exp(0.8 + 0.6 * x[:, 2])  # the card's transactions that day
    x[:, 3] = rng.exponential(600.0, RARE_ROWS)  # minutes since the card's last transaction
    late = seconds >= RARE_NEW_RULE_DAY * 86_400
    log_amount, log_distance = np.log(x[:, 0]), np.log1p(x[:, 1])
    early = 1.2 * log_amount + 1.0 * log_distance + 0.8 * x[:, 4]
    later = -0.9 * log_amount - 0.9 * np.log1p(x[:, 3]) + 0.8 * np.log(x[:, 2]) + 0.9 * x[:, 5] - 0.7 * x[:, 6]
    probability = np.empty(RARE_ROWS)
    for rows, rule in ((~late, early), (late, later)):
        probability[rows] = fraud_probability(rule[rows], RARE_FRAUD_SHARE)
    fraud = rng.uniform(size=RARE_ROWS) < probability
    start = datetime(2026, 1, 1)
    when = np.array([(start + timedelta(seconds=float(s))).isoformat(timespec="seconds") for s in seconds])
    columns = {"when": when}
    columns |= {f"f{i:02d}": x[:, i].round(4) for i in range(RARE_FEATURES)}
    columns["label"] = np.where(fraud, "fraud", "ok")
    order = rng.permutation(RARE_ROWS)  # written out of time order
    return {name: values[order] for name, values in columns.items()}


def fraud_probability(score: np.ndarray, share: float, steepness: float = RARE_STEEPNESS) -> np.ndarray:
    """Each row's chance of fraud, a logistic of its rule's score whose intercept (found by bisection)
    makes the expected fraud share ``share``."""
    low, high = float(score.min()), float(score.max()) + 50 / steepness
    for _ in range(100):
        intercept = (low + high) / 2
        p = 1 / (1 + np.exp(-steepness * (score - intercept)))
        low, high = (intercept, high) if p.mean() > share else (low, intercept)
    return p


def write_csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out",
        nargs="?",
        help="the CSV to write (default runs/data/transactions.csv, with --rare runs/data/transactions-rare.csv)",
    )
    parser.add_argument(
        "--rare", action="store_true", help="the rare-fraud history (0.7 %% fraud, rule change on day 30)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the history's seed (default 0)")
    args = parser.parse_args(argv)
    default = "runs/data/transactions-rare.csv" if args.rare else "runs/data/transactions.csv"
    out = Path(args.out or default)
    columns = rare_fraud_transactions(args.seed) if args.rare else transactions(args.seed)
    write_csv(out, columns)
    rows = len(columns["label"])
    print(f"wrote {out}: {rows} transactions, {np.mean(columns['label'] == 'fraud'):.1%} fraud")


if __name__ == "__main__":
    main()
