"""benchmarks/bench_long_stream.py on a tiny stream: it runs, judges, and the freshness bound holds in its runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("river", reason="River is not installed: pip install -e '.[river]' (CI installs it)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_long_stream.py"


@pytest.mark.slow
def test_a_tiny_long_stream_is_judged_by_its_served_measure(tmp_path: Path) -> None:
    out = tmp_path / "long_stream_tiny.json"
    command = [sys.executable, str(SCRIPT), "--streams", "hyperplane", "--seeds", "0", "1", "--waits", "1", "4"]
    command += ["--bounds", "3", "--chunks", "24", "--chunk-examples", "20", "--epochs", "1", "--test-examples", "50"]
    command += ["--runs", str(tmp_path / "runs.json"), "--out", str(out), "--figures", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)

    report = json.loads(out.read_text())["streams"]["hyperplane"]
    rows = report["policies"]
    assert rows["fixed w=1"]["schedule"] and not rows["adaptive, age <= 3"]["schedule"]
    # The bound forces stages on the policies that grow their wait, and no run waits past it.
    for name in ("geometric 0.5, age <= 3", "adaptive, age <= 3", "forecast, age <= 3"):
        assert rows[name]["longest_wait"] < 3
    assert rows["adaptive, age <= 3"]["forced_stages"] > 0
    assert rows["fixed w=4"]["longest_wait"] == 3
    verdict = report["verdicts"]["adaptive, age <= 3"]
    assert verdict["best"] in ("fixed w=1", "fixed w=4", "geometric 0.5")
    assert verdict["met"] == (verdict["difference"] <= 0 and verdict["flops_ratio"] <= 1.0)
    assert (tmp_path / "long-stream-tiny.png").is_file()
    assert (tmp_path / "long-stream-tiny-served.png").is_file()
    assert "| adaptive, age <= 3 |" in out.with_suffix(".md").read_text()
