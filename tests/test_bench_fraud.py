"""The rare-fraud history of examples/table/make_transactions.py (``--rare``) and benchmarks/bench_fraud.py's
judging, without training (the benchmark itself: docs/benchmarks.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from examples.table import make_transactions

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_fraud.py"
#: sha256 of the default history (runs/data/transactions.csv) as docs/results.md and tests/test_table.py know it.
DEFAULT_HISTORY_SHA256 = "1d163dfaa0baf8a18347082e158953b43838cafc850098729f4cbd813633dc90"


def bench_fraud():
    spec = importlib.util.spec_from_file_location("bench_fraud", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def days(when: np.ndarray) -> np.ndarray:
    start = datetime(2026, 1, 1)
    return np.array([(datetime.fromisoformat(w) - start).total_seconds() / 86_400 for w in when])


@pytest.fixture(scope="module")
def rare() -> dict[str, np.ndarray]:
    return make_transactions.rare_fraud_transactions(0)


def test_the_rare_history_has_its_shape_and_a_fraud_share_between_half_and_one_percent(rare):
    assert list(rare) == ["when", *[f"f{i:02d}" for i in range(12)], "label"]
    assert all(len(values) == 30_000 for values in rare.values())
    assert set(rare["label"]) == {"ok", "fraud"}
    for seed in (0, 1, 2):
        columns = rare if seed == 0 else make_transactions.rare_fraud_transactions(seed)
        assert 0.005 <= np.mean(columns["label"] == "fraud") <= 0.01, seed
    t = days(rare["when"])
    assert 0 <= t.min() < 1 and 59 < t.max() < 60


def test_the_rare_history_has_skewed_features_among_normal_ones(rare):
    def skew(values: np.ndarray) -> float:
        centred = values - values.mean()
        return float(np.mean(centred**3) / np.mean(centred**2) ** 1.5)

    for name in ("f00", "f01", "f02", "f03"):
        assert rare[name].min() >= 0 and skew(rare[name]) > 1.5, name
    for name in ("f04", "f08", "f11"):
        assert abs(skew(rare[name])) < 0.1, name


def test_the_rare_history_is_shuffled_and_its_fraud_rule_changes_on_day_30(rare):
    t = days(rare["when"])
    assert not np.all(np.diff(t) >= 0)
    assert abs(np.corrcoef(np.arange(len(t)), t)[0, 1]) < 0.05  # no trace of time order
    assert t[:1000].max() - t[:1000].min() > 55
    fraud, amount = rare["label"] == "fraud", np.log(rare["f00"])
    before, after = t < 30, t >= 30
    # Before the change fraud is large amounts; from day 30 on, small ones.
    assert amount[fraud & before].mean() > amount[~fraud & before].mean() + 0.5
    assert amount[fraud & after].mean() < amount[~fraud & after].mean() - 0.5
    for period in (before, after):
        assert 0.004 < fraud[period].mean() < 0.011


def test_the_rare_history_is_seeded():
    again = make_transactions.rare_fraud_transactions(0)
    other = make_transactions.rare_fraud_transactions(1)
    assert np.array_equal(again["f00"], make_transactions.rare_fraud_transactions(0)["f00"])
    assert not np.array_equal(again["f00"], other["f00"])


def test_the_default_history_is_unchanged(tmp_path):
    path = tmp_path / "transactions.csv"
    make_transactions.write_csv(path, make_transactions.transactions())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == DEFAULT_HISTORY_SHA256


def test_the_generator_writes_the_rare_history_where_the_example_reads_it(tmp_path):
    out = tmp_path / "rare.csv"
    make_transactions.main(["--rare", "--seed", "2", str(out)])
    header = out.read_text().splitlines()[0]
    assert header == "when," + ",".join(f"f{i:02d}" for i in range(12)) + ",label"
    assert "runs/data/transactions-rare.csv" in (REPO / "examples" / "table" / "fraud-rare.yaml").read_text()


def test_the_benchmark_judges_the_issue_target_on_the_means():
    bench = bench_fraud()

    def row(pr_auc: float | None, cumulative: float | None) -> dict:
        out = {}
        if pr_auc is not None:
            out["test_pr_auc"] = {"mean": pr_auc, "sd": None, "per_seed": [pr_auc]}
        if cumulative is not None:
            out["cumulative_prequential_cost"] = {"mean": cumulative, "sd": None, "per_seed": [cumulative]}
        return out

    names, labels = bench.REFERENCE_NAMES, {name: label for name, (label, _) in bench.CONFIGURATIONS.items()}
    summary = {
        labels["example"]: row(0.55, 2.0),
        labels["nightly"]: row(0.5, 2.5),
        names["lr-weighted-3"]: row(0.6, None),
        names["lr-plain-4"]: row(0.58, None),
        names["nothing"]: row(0.007, 3.3),
    }
    judged = bench.verdicts(summary, ["example", "nightly"])
    assert judged["best logistic regression"] == names["lr-weighted-3"] and judged["met"]
    # The prequential River reference is part of the target; the nightly retrain stands beside it.
    behind_reference = bench.verdicts({**summary, bench.REFERENCE_ROW: row(None, 1.5)}, ["example", "nightly"])
    assert not behind_reference["cumulative prequential cost below the prequential River linear reference's"]
    assert not behind_reference["met"]
    summary[labels["nightly"]] = row(0.5, 1.9)
    assert bench.verdicts(summary, ["example", "nightly"])["met"]
    summary[labels["example"]] = row(0.5, 2.0)  # 83 % of the best logistic regression's
    judged = bench.verdicts(summary, ["example", "nightly"])
    assert not judged["PR-AUC within 10 % of the best logistic regression's"] and not judged["met"]
    assert "Target MISSED." in bench.markdown(
        summary,
        judged,
        {
            **dict.fromkeys(("command", "machine", "when")),
            "seeds": [1],
            "chunk_rows": 2700,
            "chunk_frauds": 18,
            "test_rows": 3000,
            "test_frauds": 22,
            "run_seconds": 60,
        },
    )
    assert bench.verdicts({**summary, labels["example"]: None}, ["example"]) is None


def test_the_benchmark_names_the_extra_when_scikit_learn_is_missing():
    code = (
        "import runpy, sys; sys.modules['sklearn'] = None; sys.argv = ['bench_fraud.py', '--quick'];"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        'bench_fraud.py needs scikit-learn for its offline references: pip install -e ".[bench]"'
    ]
    extras = (REPO / "pyproject.toml").read_text()
    assert 'bench = ["scikit-learn' in extras
