"""What one Prometheus scrape of alma-daemon costs: rendering ``/metrics`` and serving it over HTTP.

The registry is first filled by a real engine replaying a small MNIST stream (so every series holds
a value, histograms included). Then, interleaved so machine noise hits both alike:

- render: ``generate_latest(REGISTRY)``, the work done inside the daemon per scrape (text format);
- render_openmetrics: the same in OpenMetrics, the format Prometheus 2.x asks for;
- http: a full ``GET /metrics`` from the exporter over loopback, as Prometheus does it.

Figures are the median and 95th percentile of ``--renders`` repetitions, in microseconds.

    python benchmarks/bench_scrape.py [--renders 200] [--out benchmarks/results/scrape.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from alma_daemon.config import build_config
from alma_daemon.metrics import REGISTRY
from alma_daemon.observability.exporter import MetricsObserver, start_exporter
from alma_daemon.research.simulate import run_simulation

STREAM = [
    "stream.train_examples=1200",
    "stream.megabatches=4",
    "train.epochs=2",
    "learner.width=8",
    "dataset.test_examples=300",
    "device=cpu",
]


def percentiles_us(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "median_us": round(statistics.median(ordered) * 1e6, 1),
        "p95_us": round(ordered[int(0.95 * (len(ordered) - 1))] * 1e6, 1),
    }


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--out", default="benchmarks/results/scrape.json")
    args = parser.parse_args()

    run_simulation(build_config({}, STREAM), None, progress=False, observers=[MetricsObserver(in_process_source=True)])
    text = generate_latest(REGISTRY)
    families = list(text_string_to_metric_families(text.decode()))
    with start_exporter(0) as exporter:
        url = f"{exporter.url}/metrics"

        def fetch() -> bytes:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read()

        fetch()  # warm-up: first connection, first encoder call
        times: dict[str, list[float]] = {"render": [], "render_openmetrics": [], "http": []}
        for _ in range(args.renders):
            times["render"].append(timed(lambda: generate_latest(REGISTRY)))
            times["render_openmetrics"].append(timed(lambda: generate_openmetrics(REGISTRY)))
            times["http"].append(timed(fetch))

    result = {
        "benchmark": "scrape",
        "renders": args.renders,
        "families": len(families),
        "samples": sum(len(f.samples) for f in families),
        "bytes": len(text),
        **{name: percentiles_us(values) for name, values in times.items()},
        # The machine is shared: the load average says how busy it was while measuring.
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
