"""Hot-swap cost: checkpoint written -> new version default, and what clients feel meanwhile.

A TorchServe is started the way ``alma serve`` starts it (free loopback ports, temp folder). An
MNIST MLP (the paper's SM, width 64) is trained once for a few seconds; each version is that
model plus a little noise, so every version differs. Four client threads, in a process of their
own as real clients are, send predictions (one MNIST image per request, keep-alive connections) to
``/predictions/<model>`` the whole time:

1. at rest: ``--rest-seconds`` with no swap;
2. swaps: ``--swaps`` times, a checkpoint is written and submitted to the daemon's background
   publisher (as the daemon's hand-off does once the step is committed); the swap time runs from
   the end of the checkpoint write until TorchServe's ``set-default`` call has returned (the moment
   the publisher records as ``promoted_at``, also what ``alma_swap_duration_seconds`` observes).
   The next swap starts once the publisher is idle (old versions drained and unregistered) plus 1 s.

A request counts as "during swaps" if it started inside a swap window (checkpoint written ->
publisher idle). Reported: swap time median and p95; client latency p50/p99 at rest and during
swaps; failed requests (non-200 or no answer). The guard runs with ``promotion_margin: 1.0`` so
that every swap happens; it still evaluates both versions.

Run from the repository root (needs Java 17, torchserve==0.12.0, torch-model-archiver==0.12.0 and
the MNIST files)::

    python benchmarks/bench_swap.py            # writes benchmarks/results/swap.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from alma_daemon.config import TrainConfig, build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import load_dataset
from alma_daemon.learners import Learner, build_learner
from alma_daemon.local_servers.processes import free_ports
from alma_daemon.local_servers.torchserve import TorchServeServer
from alma_daemon.training.loop import Trainer
from serving import make_publisher
from serving.background import BackgroundPublisher

CLIENTS = 4
MODEL = "alma"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def trained_mlp(config, train, val) -> Learner:
    learner = build_learner("sm", load_dataset("mnist").task, config.learner, seed=0)
    trainer = Trainer(TrainConfig(epochs=2, patience=2), "adadelta", torch.device("cpu"), seed=0)
    learner.fit(train, val, trainer)
    return learner


def perturbed(learner: Learner, seed: int) -> Learner:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in learner.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-3)
    return learner


class Clients:
    """Client threads sending predictions continuously; each request is (start, latency, ok)."""

    def __init__(self, inference_url: str, body: bytes):
        self.address = inference_url.split("//", 1)[1]
        self.body = body
        self.stop = threading.Event()
        self.records: list[tuple[float, float, bool]] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _run(self) -> None:
        host, port = self.address.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        while not self.stop.is_set():
            start = time.monotonic()
            ok, problem = False, ""
            try:
                connection.request("POST", f"/predictions/{MODEL}", self.body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                ok = response.status == 200 and len(json.loads(answer)["predictions"]) == 1
                problem = "" if ok else f"{response.status}: {answer[:200]!r}"
            except (OSError, http.client.HTTPException, ValueError) as err:
                problem = f"no answer: {err!r}"
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
            with self._lock:
                self.records.append((start, time.monotonic() - start, ok))
                if problem:
                    self.failures.append(problem)
        connection.close()


def run_clients(inference_url: str, body: bytes, ready, stop, out_path: str) -> None:
    """Child process: the clients run apart from the publisher, as real clients do, so that the
    publisher's work in this process cannot hold their interpreter lock."""
    clients = Clients(inference_url, body)
    clients.start()
    ready.set()
    stop.wait()
    clients.close()
    Path(out_path).write_text(json.dumps({"records": clients.records, "failures": clients.failures}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--rest-seconds", type=float, default=20.0)
    parser.add_argument("--keep-versions", type=int, default=2, help="serving.keep_versions (product default 2)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "swap.json"))
    args = parser.parse_args()

    mnist = load_dataset("mnist")
    folder = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    inference, management, metrics = free_ports(3)
    config = build_config(
        {
            "learner": {"name": "sm", "width": 64},
            "daemon": {"state_dir": str(folder / "state"), "checkpoint_dir": str(folder / "model_store")},
            "serving": {
                "kind": "torchserve",
                "model_name": MODEL,
                "inference_url": f"http://127.0.0.1:{inference}",
                "management_url": f"http://127.0.0.1:{management}",
                "metrics_url": f"http://127.0.0.1:{metrics}",
                "keep_versions": args.keep_versions,
                "promotion_margin": 1.0,
            },
        }
    )
    learner = trained_mlp(config, mnist.train.subset(slice(0, 6000)), mnist.test.subset(slice(0, 500)))
    sample = mnist.test.subset(slice(500, 1012))
    store = CheckpointStore(config.daemon.checkpoint_dir, MODEL)
    publisher = make_publisher(config)
    server = TorchServeServer.for_config(config)
    server.start()
    worker = BackgroundPublisher(publisher).start()
    body = json.dumps({"instances": mnist.test.x[:1].tolist()}).encode()
    context = multiprocessing.get_context("spawn")
    clients_ready, stop_clients = context.Event(), context.Event()
    clients_out = folder / "clients.json"
    clients = context.Process(
        target=run_clients, args=(config.serving.inference_url, body, clients_ready, stop_clients, str(clients_out))
    )
    windows: list[tuple[float, float]] = []
    swap_seconds: list[float] = []
    try:
        store.save(learner, 1, {"val_error": learner.evaluate(sample)["error"]}, validation=sample)
        worker.submit(1)
        assert worker.wait_idle(timeout=300), "first version not published"
        load_at_start = os.getloadavg()[0]
        clients.start()
        assert clients_ready.wait(timeout=300), "the client process did not start"
        time.sleep(2.0)  # connections opened, worker warm
        rest_began = time.monotonic()
        time.sleep(args.rest_seconds)
        rest_ended = time.monotonic()
        for version in range(2, args.swaps + 2):
            candidate = perturbed(learner, seed=version)
            store.save(candidate, version, {"val_error": candidate.evaluate(sample)["error"]}, validation=sample)
            written = time.monotonic()
            worker.submit(version, written_at=written)
            assert worker.wait_idle(timeout=300), f"version {version} not published; last error: {worker.last_error}"
            outcome = worker.last_outcome
            assert outcome is not None and outcome.version == version and outcome.promoted_at is not None, outcome
            assert publisher.client.default_version(MODEL) == version
            swap_seconds.append(outcome.promoted_at - written)
            windows.append((written, time.monotonic()))
            time.sleep(1.0)
    finally:
        stop_clients.set()
        if clients.pid is not None:
            clients.join()
        worker.close()
        server.stop()
    answered = json.loads(clients_out.read_text())
    records, failures = answered["records"], answered["failures"]
    shutil.rmtree(folder, ignore_errors=True)

    def latencies(keep) -> list[float]:
        # time.monotonic() is the system's monotonic clock, the same in the client process.
        return [latency for start, latency, ok in records if keep(start)]

    at_rest = latencies(lambda s: rest_began <= s < rest_ended)
    during = latencies(lambda s: any(a <= s < b for a, b in windows))
    results = {
        "benchmark": "swap",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_average_1min": {"start": load_at_start, "end": os.getloadavg()[0]},
        },
        "setup": {
            "model": "MNIST SM (MLP width 64)",
            "clients": f"{CLIENTS} threads in their own process",
            "examples_per_request": 1,
            "swaps": args.swaps,
            "keep_versions": args.keep_versions,
            "workers_per_version": 1,
        },
        "swap_seconds": {
            "median": statistics.median(swap_seconds),
            "p95": percentile(swap_seconds, 95),
            "all": [round(s, 3) for s in swap_seconds],
        },
        "latency_ms": {
            "at_rest": {
                "p50": 1e3 * percentile(at_rest, 50),
                "p99": 1e3 * percentile(at_rest, 99),
                "requests": len(at_rest),
            },
            "during_swaps": {
                "p50": 1e3 * percentile(during, 50),
                "p99": 1e3 * percentile(during, 99),
                "requests": len(during),
            },
        },
        "requests": len(records),
        "failed_requests": len(failures),
        "failures": failures[:20],
    }
    results["latency_ms"]["p99_during_over_rest"] = (
        results["latency_ms"]["during_swaps"]["p99"] / results["latency_ms"]["at_rest"]["p99"]
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("swap_seconds", "latency_ms", "requests", "failed_requests")}, indent=2))
    return 0 if results["failed_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
