"""Hot-swap cost on TorchServe and on KServe's model server: checkpoint written -> new version default,
and what clients feel meanwhile.

Each server measured (``--server torchserve``, ``kserve`` or ``both``, one after the other on the
same machine with the same model, versions, swaps and client load) is started the way ``alma serve``
starts it (free loopback ports, a temp folder), at niceness ``--niceness`` (default 0, a machine
that only serves: ``alma serve``'s default 19 would let anything else on a shared machine slow it).
An MNIST MLP (the paper's SM, width 64) is trained once for a few seconds; version 1 is that model,
version N that model plus a little noise seeded with N, so every version differs and both servers
get the same ones. Four client threads, in a process of their own as real clients are, send
predictions at full speed over keep-alive connections: TorchServe's ``/predictions/alma``
(``{"instances": [...]}``), KServe's ``/v2/models/alma/infer`` (the Open Inference Protocol's
body, input ``x`` UINT8 ``[N, 28, 28]``), the same test images to both.

Per server, once version 1 is live, two client phases, one per batch size (1 example per request,
then 64; a fresh client process each), each:

1. at rest: no swap until the clients have sent ``--rest-requests`` requests (one count per batch
   size, the same for every server, after 2 s of warm-up);
2. swaps: ``--swaps`` times, a checkpoint is written and submitted to the daemon's background
   publisher (as the daemon's hand-off does once the step is committed); the swap time runs from
   the end of the checkpoint write until the new version is the default (the moment the publisher
   records as ``promoted_at``, also what ``alma_swap_duration_seconds`` observes: TorchServe's
   ``set-default`` returned, KServe's load of ``alma`` returned). The server is then asked which
   version it serves; the next swap starts once the publisher is idle (old versions retired) plus 1 s.

A request counts as "during swaps" if it started inside a swap window (checkpoint written ->
publisher idle); it failed if it got no answer, a status other than 200, or not one row of 10
probabilities per example. The guard runs with ``promotion_margin: 1.0`` so that every swap
happens; it still evaluates both versions.

Reported per server: swap seconds (median, max, all) over both phases (2 x ``--swaps`` swaps);
per batch size, latency p50/p99 at rest and during swaps, and requests per second at rest;
requests in all (the rest phases' counts, plus what each server answered during its swaps) and
failed ones; the server's memory, resident set size (RSS, and PSS, which counts
pages its processes share once) summed over its process group (TorchServe: launcher, JVM and one
worker per loaded version; KServe: one process), once version 1 is live (no client yet), after the
batch-1 rest phase, and at the end, with the peak RSS sampled every second; the server's CPU time
per request at rest; the 1-minute load average at each phase's start and end (the machine may be
shared: compare servers only within one run). A Markdown table of the figures is written beside
the JSON. ``--server-omp-threads N`` sets ``OMP_NUM_THREADS`` for both servers (torch's threads per
forward pass; unset, torch takes one per core), to see what the servers' thread settings cost.

Run from the repository root (needs Java 17, torchserve==0.12.0, torch-model-archiver==0.12.0,
kserve==0.21.0 and the MNIST files)::

    python benchmarks/bench_swap.py --server both   # writes benchmarks/results/swap_kserve_vs_torchserve.{json,md}
    python benchmarks/bench_swap.py --server kserve  # writes benchmarks/results/swap_kserve.{json,md}
    python benchmarks/bench_swap.py --server kserve triton  # writes benchmarks/results/swap_kserve_vs_triton.{json,md}

Triton (``--server triton``, scripts/setup_triton.sh's virtualenv) is asked as KServe's is: the same
protocol, requests and version check; its processes (tritonserver and one Python backend process per
loaded version) are one process group, measured as the others'.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from alma_daemon.config import Config, TrainConfig, build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import TaskInfo, load_dataset
from alma_daemon.learners import Learner, build_learner
from alma_daemon.local_servers.kserve import KServeServer
from alma_daemon.local_servers.processes import ServerProcess, free_ports, group_members
from alma_daemon.local_servers.torchserve import TorchServeServer
from alma_daemon.local_servers.triton import TritonServer
from alma_daemon.local_servers.triton_install import triton_python
from alma_daemon.training.loop import Trainer
from serving.protocols.codecs import codec_for
from serving.publishing import make_publisher
from serving.publishing.background import BackgroundPublisher
from serving.publishing.publisher import Publisher

CLIENTS = 4
MODEL = "alma"
CLASSES = 10
BATCHES = (1, 64)
MIB = 2**20
RESULTS = Path(__file__).parent / "results"
#: The longest a rest phase may take (TorchServe answers a few requests of 64 examples a second).
REST_TIMEOUT_SECONDS = 900.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def trained_mlp(config: Config, train, val) -> Learner:
    learner = build_learner("sm", load_dataset("mnist").task, config.learner, seed=0)
    trainer = Trainer(TrainConfig(epochs=2, patience=2), "adadelta", torch.device("cpu"), seed=0)
    learner.fit(train, val, trainer)
    return learner


def as_version(learner: Learner, base: dict[str, torch.Tensor], version: int) -> Learner:
    """``learner`` holding version ``version``: the base weights, plus noise seeded with ``version`` after the first."""
    learner.model.load_state_dict(base)
    if version > 1:
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for parameter in learner.model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-3)
    return learner


# -- the servers ---------------------------------------------------------------------------------
def server_config(folder: Path, serving: dict[str, Any], niceness: int, keep_versions: int) -> Config:
    return build_config(
        {
            "learner": {"name": "sm", "width": 64},
            "daemon": {"state_dir": str(folder / "state"), "checkpoint_dir": str(folder / "model_store")},
            "serving": {
                "model_name": MODEL,
                "keep_versions": keep_versions,
                "promotion_margin": 1.0,
                "niceness": niceness,
                **serving,
            },
        }
    )


def start_torchserve(folder: Path, niceness: int, keep_versions: int) -> tuple[ServerProcess, Config]:
    inference, management, metrics = free_ports(3)
    urls = {
        "inference_url": f"http://127.0.0.1:{inference}",
        "management_url": f"http://127.0.0.1:{management}",
        "metrics_url": f"http://127.0.0.1:{metrics}",
    }
    config = server_config(folder, {"kind": "torchserve", **urls}, niceness, keep_versions)
    server = TorchServeServer.for_config(config)
    server.start()
    return server, config


def start_kserve(folder: Path, niceness: int, keep_versions: int) -> tuple[ServerProcess, Config]:
    # The server takes a free port of its own (again if another process takes it first): the
    # publisher is configured with the one it ended up on.
    server = KServeServer(folder / "kserve", folder / "model_store", MODEL, niceness=niceness)
    server.start()
    config = server_config(folder, {"kind": "kserve", **server.publisher_settings()}, niceness, keep_versions)
    return server, config


def start_triton(folder: Path, niceness: int, keep_versions: int) -> tuple[ServerProcess, Config]:
    # As KServe's: a free port of its own; the publisher writes Triton's repository in the model store.
    server = TritonServer(folder / "triton", folder / "model_store", MODEL, niceness=niceness)
    server.start()
    return server, server_config(folder, server.publisher_settings(), niceness, keep_versions)


def torchserve_rows(answer: dict) -> int:
    rows = answer["predictions"]
    return len(rows) if all(isinstance(row, list) and len(row) == CLASSES for row in rows) else -1


def kserve_rows(answer: dict) -> int:
    (probabilities,) = (tensor for tensor in answer["outputs"] if tensor["name"] == "probabilities")
    rows = probabilities["shape"][0]
    complete = probabilities["shape"] == [rows, CLASSES] and len(probabilities["data"]) == rows * CLASSES
    return rows if complete else -1


def torchserve_default(publisher: Publisher, request: dict) -> int | None:
    return publisher.client.default_version(MODEL)  # type: ignore[attr-defined]


def kserve_default(publisher: Publisher, request: dict) -> int | None:
    # What a client's request is answered by, not only what the publisher recorded.
    return int(publisher.client.infer(MODEL, request)["model_version"])  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ServerKind:
    """One server as this benchmark drives it: how it starts, how clients ask it, what version it serves."""

    title: str
    start: Callable[[Path, int, int], tuple[ServerProcess, Config]]
    path: str
    request: Callable[[TaskInfo, torch.Tensor], dict]
    #: Rows of probabilities in a parsed answer (-1 where one is incomplete); raises on a malformed one.
    rows: Callable[[dict], int]
    default_version: Callable[[Publisher, dict], int | None]


SERVERS: dict[str, ServerKind] = {
    "torchserve": ServerKind(
        "TorchServe",
        start_torchserve,
        f"/predictions/{MODEL}",
        lambda task, x: {"instances": x.tolist()},
        torchserve_rows,
        torchserve_default,
    ),
    "kserve": ServerKind(
        "KServe",
        start_kserve,
        f"/v2/models/{MODEL}/infer",
        lambda task, x: codec_for(task).encode_oip(x),
        kserve_rows,
        kserve_default,
    ),
    # The same protocol: the same requests, answers and version check as KServe's.
    "triton": ServerKind(
        "Triton",
        start_triton,
        f"/v2/models/{MODEL}/infer",
        lambda task, x: codec_for(task).encode_oip(x),
        kserve_rows,
        kserve_default,
    ),
}


# -- the server's resources ------------------------------------------------------------------------
def group_processes(pgid: int) -> list[psutil.Process]:
    processes = []
    for pid in group_members(pgid):
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return processes


def group_memory(pgid: int) -> dict[str, float]:
    """RSS and PSS (MiB) summed over process group ``pgid``, and how many processes it has."""
    rss = pss = 0
    processes = 0
    for process in group_processes(pgid):
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss, processes = rss + info.rss, pss + info.pss, processes + 1
    return {"rss_mib": rss / MIB, "pss_mib": pss / MIB, "processes": processes}


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user and system) the live processes of group ``pgid`` have used."""
    seconds = 0.0
    for process in group_processes(pgid):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds += times.user + times.system
    return seconds


class PeakMemory:
    """The largest RSS summed over a process group, sampled every second on a thread."""

    def __init__(self, pgid: int):
        self.pgid = pgid
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PeakMemory:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            rss = 0
            for process in group_processes(self.pgid):
                try:
                    rss += process.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            self.peak_mib = max(self.peak_mib, rss / MIB)


# -- the clients -----------------------------------------------------------------------------------
class Clients:
    """Client threads sending predictions continuously; each request is (start, latency, ok), and
    counted in ``sent`` (shared with the benchmark's process) once answered."""

    def __init__(self, kind: str, inference_url: str, body: bytes, batch: int, sent):
        self.rows = SERVERS[kind].rows
        self.path = SERVERS[kind].path
        self.address = inference_url.split("//", 1)[1]
        self.body = body
        self.batch = batch
        self.sent = sent
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
                connection.request("POST", self.path, self.body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                ok = response.status == 200 and self._rows(answer) == self.batch
                problem = "" if ok else f"{response.status}: {answer[:200]!r}"
            except (OSError, http.client.HTTPException) as err:
                problem = f"no answer: {err!r}"
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
            with self._lock:
                self.records.append((start, time.monotonic() - start, ok))
                if problem:
                    self.failures.append(problem)
            with self.sent.get_lock():
                self.sent.value += 1
        connection.close()

    def _rows(self, answer: bytes) -> int:
        try:
            return self.rows(json.loads(answer))
        except (ValueError, KeyError, TypeError, IndexError):
            return -1


def run_clients(kind: str, inference_url: str, body: bytes, batch: int, sent, ready, stop, out_path: str) -> None:
    """Child process: the clients run apart from the publisher, as real clients do, so that the
    publisher's work in this process cannot hold their interpreter lock."""
    clients = Clients(kind, inference_url, body, batch, sent)
    clients.start()
    ready.set()
    stop.wait()
    clients.close()
    Path(out_path).write_text(json.dumps({"records": clients.records, "failures": clients.failures}))


# -- one server --------------------------------------------------------------------------------------
@dataclass
class Bench:
    """One server under test, its publisher, and the model whose versions it is given."""

    kind: str
    server: ServerProcess
    config: Config
    worker: BackgroundPublisher
    store: CheckpointStore
    learner: Learner
    base: dict[str, torch.Tensor]
    sample: Any
    images: torch.Tensor
    folder: Path

    @property
    def pgid(self) -> int:
        assert self.server.pid is not None
        return self.server.pid

    def publish(self, version: int) -> tuple[float, float]:
        """Write checkpoint ``version`` and have it published: when it was written, and the seconds
        from then until it was the default."""
        candidate = as_version(self.learner, self.base, version)
        self.store.save(
            candidate, version, {"val_error": candidate.evaluate(self.sample)["error"]}, validation=self.sample
        )
        written = time.monotonic()
        self.worker.submit(version, written_at=written)
        assert self.worker.wait_idle(timeout=300), (
            f"version {version} not published; last error: {self.worker.last_error}"
        )
        outcome = self.worker.last_outcome
        assert outcome is not None and outcome.version == version and outcome.promoted_at is not None, outcome
        probe = SERVERS[self.kind].request(self.learner.task, self.images[:1])
        served = SERVERS[self.kind].default_version(self.worker.publisher, probe)
        assert served == version, f"{self.kind} serves version {served}, not {version}"
        return written, outcome.promoted_at - written

    def phase(self, batch: int, versions: range, rest_requests: int) -> dict[str, Any]:
        """Clients at ``batch`` examples per request: at rest, then one swap per version."""
        body = json.dumps(SERVERS[self.kind].request(self.learner.task, self.images[:batch])).encode()
        context = multiprocessing.get_context("spawn")
        ready, stop, sent = context.Event(), context.Event(), context.Value("q", 0)
        out = self.folder / f"clients-{batch}.json"
        url = self.config.serving.inference_url
        clients = context.Process(target=run_clients, args=(self.kind, url, body, batch, sent, ready, stop, str(out)))
        load = {"start": os.getloadavg()[0]}
        windows: list[tuple[float, float]] = []
        swap_seconds: list[float] = []
        try:
            clients.start()
            assert ready.wait(timeout=300), "the client process did not start"
            time.sleep(2.0)  # connections opened, server warm
            cpu_before, rest_began = group_cpu_seconds(self.pgid), time.monotonic()
            wait_for_requests(sent, sent.value + rest_requests, clients)
            cpu_after, rest_ended = group_cpu_seconds(self.pgid), time.monotonic()
            memory_at_rest = group_memory(self.pgid)
            for version in versions:
                written, seconds = self.publish(version)
                swap_seconds.append(seconds)
                windows.append((written, time.monotonic()))
                time.sleep(1.0)
        finally:
            stop.set()
            if clients.pid is not None:
                clients.join()
        load["end"] = os.getloadavg()[0]
        answered = json.loads(out.read_text())
        records, failures = answered["records"], answered["failures"]
        # time.monotonic() is the system's monotonic clock, the same in the client process.
        at_rest = [latency for start, latency, _ in records if rest_began <= start < rest_ended]
        during = [latency for start, latency, _ in records if any(a <= start < b for a, b in windows)]
        return {
            "swap_seconds": swap_seconds,
            "latency_ms": {
                "at_rest": summary(at_rest) | {"requests_per_second": len(at_rest) / (rest_ended - rest_began)},
                "during_swaps": summary(during),
                "p99_during_over_rest": percentile(during, 99) / percentile(at_rest, 99),
            },
            "server_cpu_ms_per_request_at_rest": 1e3 * (cpu_after - cpu_before) / len(at_rest),
            "requests": len(records),
            "failed_requests": len(failures),
            "failures": failures[:20],
            "memory_after_rest": memory_at_rest,
            "load_average_1min": load,
        }


def wait_for_requests(sent, count: int, clients) -> None:
    """Block until the clients have sent ``count`` requests in all."""
    deadline = time.monotonic() + REST_TIMEOUT_SECONDS
    while sent.value < count:
        assert clients.is_alive(), "the client process died"
        assert time.monotonic() < deadline, f"no {count} requests within {REST_TIMEOUT_SECONDS:g} s"
        time.sleep(0.05)


def summary(latencies: list[float]) -> dict[str, float]:
    return {"p50": 1e3 * percentile(latencies, 50), "p99": 1e3 * percentile(latencies, 99), "requests": len(latencies)}


def bench_server(kind: str, args: argparse.Namespace, learner: Learner, sample, images: torch.Tensor) -> dict[str, Any]:
    """Start ``kind``'s server, publish version 1, run one client phase per batch size, stop it."""
    folder = Path(tempfile.mkdtemp(prefix=f"bench-swap-{kind}-"))
    began = time.monotonic()
    base = {name: value.clone() for name, value in learner.model.state_dict().items()}
    server, config = SERVERS[kind].start(folder, args.niceness, args.keep_versions)
    publisher = make_publisher(config)
    assert publisher is not None
    bench = Bench(
        kind,
        server,
        config,
        BackgroundPublisher(publisher).start(),
        CheckpointStore(config.daemon.checkpoint_dir, MODEL),
        learner,
        base,
        sample,
        images,
        folder,
    )
    peak = PeakMemory(bench.pgid).start()
    phases: dict[int, dict[str, Any]] = {}
    try:
        bench.publish(1)
        first_version = group_memory(bench.pgid)
        version = 1
        for batch in BATCHES:
            versions = range(version + 1, version + 1 + args.swaps)
            phases[batch] = bench.phase(batch, versions, args.rest_requests[BATCHES.index(batch)])
            version = versions[-1]
        end = group_memory(bench.pgid)
    finally:
        peak.close()
        bench.worker.close()
        server.stop()
        learner.model.load_state_dict(base)
        shutil.rmtree(folder, ignore_errors=True)
    swap_seconds = [s for batch in BATCHES for s in phases[batch]["swap_seconds"]]
    return {
        "server": SERVERS[kind].title,
        "swap_seconds": {
            "median": statistics.median(swap_seconds),
            "max": max(swap_seconds),
            "swaps": len(swap_seconds),
            **{f"batch_{batch}": [round(s, 3) for s in phases[batch]["swap_seconds"]] for batch in BATCHES},
        },
        "latency_ms": {f"batch_{batch}": phases[batch]["latency_ms"] for batch in BATCHES},
        "server_cpu_ms_per_request_at_rest": {
            f"batch_{batch}": phases[batch]["server_cpu_ms_per_request_at_rest"] for batch in BATCHES
        },
        "requests": sum(phases[batch]["requests"] for batch in BATCHES),
        "failed_requests": sum(phases[batch]["failed_requests"] for batch in BATCHES),
        "failures": [f for batch in BATCHES for f in phases[batch]["failures"]][:20],
        "memory": {
            "first_version": first_version,
            "after_rest_batch_1": phases[BATCHES[0]]["memory_after_rest"],
            "end": end,
            "peak_rss_mib": peak.peak_mib,
        },
        "load_average_1min": {f"batch_{batch}": phases[batch]["load_average_1min"] for batch in BATCHES},
        "seconds": time.monotonic() - began,
    }


# -- the report ---------------------------------------------------------------------------------------
def markdown(results: dict[str, Any]) -> str:
    """The figures as a table, one column per server."""
    servers = results["servers"]

    def row(label: str, cell: Callable[[dict[str, Any]], str]) -> str:
        return f"| {label} | " + " | ".join(cell(figures) for figures in servers.values()) + " |"

    def latency(batch: int, when: str) -> Callable[[dict[str, Any]], str]:
        return lambda f: "{p50:.1f} / {p99:.1f}".format(**f["latency_ms"][f"batch_{batch}"][when])

    def memory(point: str) -> Callable[[dict[str, Any]], str]:
        return lambda f: "{rss_mib:.0f} / {pss_mib:.0f} ({processes})".format(**f["memory"][point])

    setup = results["setup"]
    omp = f", OMP_NUM_THREADS={setup['server_omp_threads']}" if setup["server_omp_threads"] is not None else ""
    rest = " and ".join(
        f"{count} requests at batch {batch}" for batch, count in zip(BATCHES, setup["rest_requests"].values())
    )
    lines = [
        f"# Hot swaps: {' vs '.join(f['server'] for f in servers.values())}",
        "",
        f"`{results['command']}` ({results['machine']['cpus']} cores, {results['machine']['platform']}; "
        f"{setup['clients']}, {setup['swaps_per_server']} swaps per server, half under each batch size; "
        f"at rest {rest}; "
        f"server niceness {setup['niceness']}{omp}). Written by benchmarks/bench_swap.py, whose docstring says "
        "how each figure is measured.",
        "",
        "| | " + " | ".join(f["server"] for f in servers.values()) + " |",
        "|---|" + "---|" * len(servers),
        row("checkpoint-to-live s, median / max", lambda f: "{median:.2f} / {max:.2f}".format(**f["swap_seconds"])),
        row("failed requests / requests", lambda f: f"{f['failed_requests']} / {f['requests']}"),
    ]
    for batch in BATCHES:
        lines += [
            row(f"batch {batch}: latency ms p50 / p99 at rest", latency(batch, "at_rest")),
            row(f"batch {batch}: latency ms p50 / p99 during swaps", latency(batch, "during_swaps")),
            row(
                f"batch {batch}: requests/s at rest",
                lambda f: f"{f['latency_ms'][f'batch_{batch}']['at_rest']['requests_per_second']:.0f}",
            ),
            row(
                f"batch {batch}: server CPU ms per request at rest",
                lambda f: f"{f['server_cpu_ms_per_request_at_rest'][f'batch_{batch}']:.2f}",
            ),
        ]
    lines += [
        row("memory MiB RSS / PSS (processes), version 1 live", memory("first_version")),
        row("memory MiB RSS / PSS (processes), after batch-1 rest", memory("after_rest_batch_1")),
        row("memory MiB RSS / PSS (processes), end", memory("end")),
        row("memory MiB peak RSS", lambda f: f"{f['memory']['peak_rss_mib']:.0f}"),
        row(
            "load average (1 min) over the run",
            lambda f: "{:.1f} - {:.1f}".format(
                min(v for load in f["load_average_1min"].values() for v in load.values()),
                max(v for load in f["load_average_1min"].values() for v in load.values()),
            ),
        ),
    ]
    return "\n".join(lines) + "\n"


def triton_version() -> str:
    """nvidia-pytriton's version in Triton's virtualenv (alma_daemon/local_servers/triton.py)."""
    script = "import importlib.metadata as m; print(m.version('nvidia-pytriton'))"
    return subprocess.run([str(triton_python()), "-c", script], capture_output=True, text=True).stdout.strip()


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--server", choices=[*SERVERS, "both"], nargs="+", default=["both"], help="both: torchserve and kserve"
    )
    parser.add_argument("--swaps", type=int, default=10, help="swaps per client phase (two phases per server)")
    parser.add_argument(
        "--rest-requests",
        type=int,
        nargs=len(BATCHES),
        default=[40_000, 1_000],
        metavar="N",
        help=f"requests at rest per client phase, one count per batch size {BATCHES}",
    )
    parser.add_argument("--keep-versions", type=int, default=2, help="serving.keep_versions (product default 2)")
    parser.add_argument("--niceness", type=int, default=0, help="the servers' niceness (serving.niceness)")
    parser.add_argument(
        "--server-omp-threads",
        type=int,
        help="OMP_NUM_THREADS in the servers' environment: torch's threads per forward pass (default: unset, "
        "torch takes one per core)",
    )
    parser.add_argument("--out", help="JSON file (default: results/swap_<server>.json, swap_kserve_vs_torchserve.json)")
    args = parser.parse_args()
    kinds = ["torchserve", "kserve"] if args.server == ["both"] else args.server
    if args.server_omp_threads is not None:
        # Both servers (and TorchServe's workers) inherit this process's environment.
        os.environ["OMP_NUM_THREADS"] = str(args.server_omp_threads)
    out = Path(
        args.out
        or RESULTS
        / ("swap_kserve_vs_torchserve.json" if args.server == ["both"] else f"swap_{'_vs_'.join(kinds)}.json")
    )

    mnist = load_dataset("mnist")
    learner = trained_mlp(
        build_config({"learner": {"name": "sm", "width": 64}}),
        mnist.train.subset(slice(0, 6000)),
        mnist.test.subset(slice(0, 500)),
    )
    sample = mnist.test.subset(slice(500, 1012))
    images = mnist.test.x[: max(BATCHES)]
    results: dict[str, Any] = {
        "benchmark": "swap",
        "command": "python benchmarks/bench_swap.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchserve": installed("torchserve"),
            "kserve": installed("kserve"),
            "nvidia_pytriton": triton_version() if "triton" in kinds else None,
            "load_average_1min_at_start": os.getloadavg()[0],
        },
        "setup": {
            "model": "MNIST SM (MLP width 64)",
            "clients": f"{CLIENTS} client threads in their own process",
            "examples_per_request": list(BATCHES),
            "swaps_per_server": args.swaps * len(BATCHES),
            "rest_requests": dict(zip((f"batch_{batch}" for batch in BATCHES), args.rest_requests)),
            "keep_versions": args.keep_versions,
            "niceness": args.niceness,
            "server_omp_threads": args.server_omp_threads,
        },
        "servers": {kind: bench_server(kind, args, learner, sample, images) for kind in kinds},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return 0 if all(figures["failed_requests"] == 0 for figures in results["servers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
