"""Start and first-load time of KServe's model server, TorchServe or Triton, as ``alma serve`` runs them,
on a busy machine (issue 51): before and after they started at normal priority.

``--busy`` CPU-bound loops (``python -c "while True: pass"``, normal priority, each in a session of its
own as a training daemon is) hold the cores for ``--warmup`` seconds before each start and until its
end. The server is started as ``alma serve`` starts it, at ``serving.niceness`` 19, in one of two ways:

- ``before``: at niceness 19 from its first instruction (``nice -n 19`` and its session's autogroup
  at 19), and a fixed wait of 120 s for ``/v2/health/live``, as before issue 51;
- ``after``: at normal priority until it serves a version, then at 19
  (alma_daemon/local_servers/kserve.py), and a wait that lasts as long as it keeps using CPU.

Measured per start: seconds from the spawn to ``/v2/health/live`` answering (``start``), then the first
load (``first load``: the publisher's load of ``alma-v1``, an MNIST MLP, the paper's SM at width 64,
untrained) and the switch of ``alma`` to it (``switch``), from this process with the server's token.
A ``before`` start that does not answer within 120 s is what ``alma serve`` reported as a failure;
it is given ``--before-cap`` seconds more to see how long it would have taken. The 1-minute load
average at each start's beginning is recorded (the machine may be shared: other jobs add to it).

``--server torchserve`` measures TorchServe (alma_daemon/local_servers/torchserve.py) the same way, on
free loopback ports at ``serving.niceness`` 19: ``before`` under ``nice -n 19`` from its first
instruction with a fixed wait of 120 s for ``/ping``; ``after`` at normal priority, each worker
taking 19 once its version is loaded (serving/runtimes/torchserve_handler.py), and a wait that lasts as long as it keeps
using CPU. Measured per start: seconds from the spawn to ``/ping`` answering (``start``), the first
load (``first load``: the publisher's client registering version 1 of the same MLP, synchronously:
it returns once the version's worker is loaded),
``set-default`` of version 1 (``switch``) and the first prediction of ``alma`` (``first answer``,
checked against the MLP in process).

``--server triton`` measures Triton (alma_daemon/local_servers/triton.py, from scripts/setup_triton.sh's
virtualenv) the same way, on a free loopback port at ``serving.niceness`` 19: ``before`` under ``nice -n
19`` from its first instruction (its Python-backend processes inherit it) with a fixed wait of 120 s
for ``/v2/health/live`` and ``ALMA_SERVING_NICENESS`` unset; ``after`` at normal priority, each
version's Python-backend process taking 19 once its checkpoint is loaded (serving/runtimes/triton/model.py),
and a wait that lasts as long as it keeps using CPU. Measured per start: seconds from the spawn to
``/v2/health/live`` answering (``start``), the first load (``first load``: the OIP client's load of
``alma-v1``, the same MLP, its folder written in Triton's model repository first as the publisher
writes it: serving/runtimes/triton/repository.py; it returns once the version's backend process has loaded it),
the switch (``switch``: the default file and the ensemble ``alma`` written, then ``alma`` loaded) and
the first inference request to ``alma`` (``first answer``, checked against the MLP in process). The
niceness of the backend process (and of its session's autogroup) after that answer is recorded too.
A load that passes the client's 180 s is waited for ``LATE_LOAD_CAP_SECONDS`` more, to see when it loads.

Run from the repository root (needs kserve==0.21.0; for TorchServe torchserve==0.12.0 and Java 17; for
Triton scripts/setup_triton.sh's virtualenv)::

    python benchmarks/bench_serve_start_busy.py            # writes benchmarks/results/serve_start_busy.md
    python benchmarks/bench_serve_start_busy.py --busy 0   # the same at rest
    python benchmarks/bench_serve_start_busy.py --server torchserve  # serve_start_busy_torchserve.md
    python benchmarks/bench_serve_start_busy.py --server triton      # serve_start_busy_triton.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from alma_daemon.config import build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.infra.priority import NICENESS_ENV
from alma_daemon.learners import build_learner
from alma_daemon.learners.base import Learner
from alma_daemon.local_servers.kserve import KServeServer
from alma_daemon.local_servers.processes import ServerStartError, group_members
from alma_daemon.local_servers.torchserve import TorchServeServer
from alma_daemon.local_servers.triton import TritonServer
from serving.protocols.codecs import codec_for, max_abs_difference
from serving.protocols.repository_token import RepositoryToken
from serving.protocols.triton_token import TritonToken
from serving.protocols.version_names import DEFAULT_FILE, versioned_name, write_default
from serving.publishing.archiver import build_archive
from serving.publishing.oip import LOAD_TIMEOUT_SECONDS, OipClient, OipError
from serving.publishing.oip import PROBE_TOLERANCE as OIP_PROBE_TOLERANCE
from serving.publishing.torchserve import (
    PROBE_TOLERANCE,
    REGISTER_TIMEOUT_SECONDS,
    TorchServeClient,
    TorchServeError,
)
from serving.runtimes.triton.repository import TritonRepository, repository_root

MODEL = "alma"
NICENESS = 19
#: ``alma serve``'s wait before issue 51.
OLD_TIMEOUT_SECONDS = 120.0
RESULTS = Path(__file__).parent / "results"
#: ``--before-cap``'s default.
BEFORE_CAP_SECONDS = 180.0
#: Each server's results file.
OUT_FILES = {
    "kserve": "serve_start_busy.md",
    "torchserve": "serve_start_busy_torchserve.md",
    "triton": "serve_start_busy_triton.md",
}
#: How long past the publisher's register (TorchServe) or load (Triton) timeout a version is waited for,
#: to see when it loads.
LATE_LOAD_CAP_SECONDS = 120.0
#: The name of Triton's Python-backend stub processes as /proc/<pid>/stat gives it (15 characters).
TRITON_STUB = "triton_python_b"


class NicedFromTheStart(KServeServer):
    """The server as ``alma serve`` ran it before issue 51: ``nice`` and autogroup at spawn, fixed wait."""

    lowers_own_priority = False  # RecordedServer.niced and spawned apply the niceness at once
    stall_timeout = None

    def command(self) -> list[str]:
        return self.niced(super().command())


class TorchServeNicedFromTheStart(TorchServeServer):
    """TorchServe as ``alma serve`` ran it before issue 51: ``nice`` and autogroup at spawn, fixed wait."""

    lowers_own_priority = False
    stall_timeout = None

    def command(self) -> list[str]:
        return self.niced(super().command())


class TritonNicedFromTheStart(TritonServer):
    """Triton as ``alma serve`` ran KServe's server and TorchServe before issue 51: ``nice`` and autogroup
    at spawn, fixed wait; no ``ALMA_SERVING_NICENESS`` (its backend processes inherit the server's 19)."""

    lowers_own_priority = False
    stall_timeout = None

    def command(self) -> list[str]:
        return self.niced(super().command())

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.pop(NICENESS_ENV, None)
        return env


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]


def model_store(root: Path) -> Path:
    """A model store holding version 1 of an MNIST MLP (untrained: its load costs what a trained one's does)."""
    CheckpointStore(root, MODEL).save(mnist_mlp(), 1, {"val_error": 0.5, "kind": "finetune"})
    return root


def mnist_mlp() -> Learner:
    config = build_config({"learner": {"name": "sm", "width": 64}})
    return build_learner("sm", MNIST_TASK, config.learner, seed=0)


def one_start(mode: str, folder: Path, store_root: Path, before_cap: float) -> dict[str, object]:
    """Start the server in ``mode``, load version 1 and make it the default; the seconds each took."""
    kind = NicedFromTheStart if mode == "before" else KServeServer
    server = kind(folder, store_root, MODEL, niceness=NICENESS, device="cpu")
    if mode == "before":
        server.start_timeout = OLD_TIMEOUT_SECONDS + before_cap
    row: dict[str, object] = {"mode": mode, "load_average": round(os.getloadavg()[0], 1)}
    began = time.monotonic()
    try:
        server.start()
    except ServerStartError as err:
        row.update(start=None, outcome=str(err).splitlines()[0])
        return row
    row["start"] = round(time.monotonic() - began, 1)
    try:
        client = OipClient(server.inference_url, RepositoryToken(server.token_file, named=True))
        began = time.monotonic()
        client.load(versioned_name(MODEL, 1))
        row["first_load"] = round(time.monotonic() - began, 1)
        write_default(store_root / MODEL, 1)
        began = time.monotonic()
        client.load(MODEL)
        row["switch"] = round(time.monotonic() - began, 2)
    finally:
        server.stop()
    row["outcome"] = start_outcome(mode, row["start"])
    return row


def start_outcome(mode: str, started: object) -> str:
    late = mode == "before" and isinstance(started, float) and started > OLD_TIMEOUT_SECONDS
    return f"would have failed (past {OLD_TIMEOUT_SECONDS:.0f} s)" if late else "started"


class TorchServeVersion:
    """Version 1 of the MLP as the publisher registers it: its archive, built once, and the answer expected."""

    def __init__(self, root: Path) -> None:
        learner = mnist_mlp()
        store = CheckpointStore(root / "model_store", MODEL)
        store.save(learner, 1, {"val_error": 0.5, "kind": "finetune"})
        self.archive = build_archive(store.path(1), MODEL, 1, root / "archives")
        codec = codec_for(MNIST_TASK)
        x = torch.randint(0, 256, (4, *MNIST_TASK.input_shape), generator=torch.Generator().manual_seed(0))
        self.request = codec.encode_json(x.to(torch.uint8))
        self.expected = codec.answer_json(learner, self.request)


def one_torchserve_start(mode: str, folder: Path, version: TorchServeVersion, before_cap: float) -> dict[str, object]:
    """Start TorchServe in ``mode``, register version 1, make it the default and ask it once; the seconds each took."""
    kind = TorchServeNicedFromTheStart if mode == "before" else TorchServeServer
    server = kind(folder)  # free loopback ports, chosen again where another process takes one first
    server.niceness = NICENESS  # alma serve's, which the class without a serving section leaves at 0
    if mode == "before":
        server.start_timeout = OLD_TIMEOUT_SECONDS + before_cap
    row: dict[str, object] = {"mode": mode, "load_average": round(os.getloadavg()[0], 1)}
    began = time.monotonic()
    try:
        server.start()
    except ServerStartError as err:
        row.update(start=None, outcome=str(err).splitlines()[0].replace(server.ping_url, "/ping"))
        return row
    row["start"] = round(time.monotonic() - began, 1)
    try:
        client = TorchServeClient(server.management_url, server.inference_url)
        codec = codec_for(MNIST_TASK)
        began = time.monotonic()
        client.register(MODEL, version.archive.resolve().as_uri(), workers=1)
        row["first_load"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        client.set_default(MODEL, 1)
        row["switch"] = round(time.monotonic() - began, 2)
        began = time.monotonic()
        answer = client.predict(MODEL, None, version.request)
        row["first_answer"] = round(time.monotonic() - began, 2)
        difference = max_abs_difference(codec.decode_json(version.expected), codec.decode_json(answer))
        if not difference <= PROBE_TOLERANCE:
            row["outcome"] = f"answered differently (largest difference {difference:.3g})"
            return row
    except TorchServeError as err:
        if "first_load" in row:
            row["outcome"] = f"started; then {str(err).splitlines()[0]}"
        else:  # the publisher gave up: how long the worker took to load all the same
            ready = worker_ready(client, time.monotonic() + LATE_LOAD_CAP_SECONDS)
            waited = round(time.monotonic() - began, 1)
            row["outcome"] = f"register timed out ({REGISTER_TIMEOUT_SECONDS:.0f} s); worker " + (
                f"loaded after {waited} s" if ready else f"not loaded after {waited} s"
            )
        return row
    finally:
        server.stop()
    row["outcome"] = start_outcome(mode, row["start"])
    return row


class TritonVersion:
    """Version 1 of the MLP in a model store, and an OIP request with the answer expected."""

    def __init__(self, store_root: Path) -> None:
        learner = mnist_mlp()
        self.store_root = store_root
        self.store = CheckpointStore(store_root, MODEL)
        self.store.save(learner, 1, {"val_error": 0.5, "kind": "finetune"})
        self.codec = codec_for(MNIST_TASK)
        x = torch.randint(0, 256, (4, *MNIST_TASK.input_shape), generator=torch.Generator().manual_seed(0))
        self.request = self.codec.encode_oip(x.to(torch.uint8))  # raw pixels, UINT8 as Triton's config asks
        self.expected = self.codec.answer_oip_in_process(learner, self.request)

    def forget(self) -> None:
        """No default and no repository folders: the next start is a first one."""
        (self.store_root / MODEL / DEFAULT_FILE).unlink(missing_ok=True)
        shutil.rmtree(repository_root(self.store_root), ignore_errors=True)


def one_triton_start(mode: str, folder: Path, version: TritonVersion, before_cap: float) -> dict[str, object]:
    """Start Triton in ``mode``, load version 1, switch ``alma`` to it and ask it once; the seconds each took."""
    kind = TritonNicedFromTheStart if mode == "before" else TritonServer
    server = kind(folder, version.store_root, MODEL, niceness=NICENESS)  # a free loopback port
    if mode == "before":
        server.start_timeout = OLD_TIMEOUT_SECONDS + before_cap
    row: dict[str, object] = {"mode": mode, "load_average": round(os.getloadavg()[0], 1)}
    began = time.monotonic()
    try:
        server.start()
    except ServerStartError as err:
        row.update(start=None, outcome=str(err).splitlines()[0])
        return row
    row["start"] = round(time.monotonic() - began, 1)
    name = versioned_name(MODEL, 1)
    try:
        client = OipClient(server.inference_url, TritonToken(server.token_file, named=True))
        repository = TritonRepository(version.store)
        repository.write_version(1)  # as the publisher does before it loads (milliseconds)
        began = time.monotonic()
        client.load(name)
        row["first_load"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        write_default(version.store.folder, 1)
        repository.write_default(1)
        client.load(MODEL)
        row["switch"] = round(time.monotonic() - began, 2)
        began = time.monotonic()
        answer = client.infer(MODEL, version.request)
        row["first_answer"] = round(time.monotonic() - began, 2)
        row["backend_niceness"] = backend_niceness(server)
        difference = max_abs_difference(version.expected, version.codec.decode_oip(answer))
        if not difference <= OIP_PROBE_TOLERANCE:
            row["outcome"] = f"answered differently (largest difference {difference:.3g})"
            return row
    except OipError as err:
        if "first_load" in row:
            row["outcome"] = f"started; then {str(err).splitlines()[0]}"
        else:  # the client gave up (or the load failed): how long the version took to load all the same
            ready = version_ready(client, name, time.monotonic() + LATE_LOAD_CAP_SECONDS)
            waited = round(time.monotonic() - began, 1)
            row["outcome"] = f"load of {name} failed or timed out ({LOAD_TIMEOUT_SECONDS:.0f} s): " + (
                f"loaded after {waited} s" if ready else f"not loaded after {waited} s"
            )
            row["error"] = str(err).splitlines()[0][:300]
        return row
    finally:
        server.stop()
    row["outcome"] = start_outcome(mode, row["start"])
    return row


def version_ready(client: OipClient, name: str, deadline: float) -> bool:
    """Whether ``name`` is loaded by ``deadline`` (its load call having failed or timed out)."""
    while time.monotonic() < deadline:
        try:
            if client.model_ready(name):
                return True
        except OipError:
            pass
        time.sleep(1.0)
    return False


def backend_niceness(server: TritonServer) -> str:
    """The nice value of each of Triton's Python-backend processes, and of their session's autogroup."""
    values, autogroups = [], set()
    for pid in group_members(server.pid) if server.pid is not None else []:
        try:
            comm, fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
            if comm.split("(", 1)[1] != TRITON_STUB:
                continue
            values.append(int(fields.split()[16]))  # field 19 of proc(5)
            autogroups.add(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile, or no autogroup here
    shown = ", ".join(map(str, sorted(values))) or "none found"
    return f"{shown} (autogroup {', '.join(sorted(autogroups))})" if autogroups else shown


def worker_ready(client: TorchServeClient, deadline: float) -> bool:
    """Whether version 1's worker is loaded by ``deadline`` (its registration call having timed out)."""
    while time.monotonic() < deadline:
        try:
            workers = client.versions(MODEL).get(1, {}).get("workers", [])
        except TorchServeError:
            workers = []
        if any(worker.get("status") == "READY" for worker in workers):
            return True
        time.sleep(1.0)
    return False


def markdown(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    def shown(value: object, unit: str = " s") -> str:
        return "-" if value is None else f"{value}{unit}"

    torchserve = args.server == "torchserve"
    triton = args.server == "triton"
    if triton:
        title = "Triton: start and first load on a busy machine"
        flag = " --server triton"
        header = (
            "| mode | run | load average | start (spawn to /v2/health/live) | first load (alma-v1) "
            "| switch (alma) | first answer | backend niceness | outcome |"
        )
        rule = "|---|---|---|---|---|---|---|---|---|"
    elif torchserve:
        title = "TorchServe: start and first load on a busy machine"
        flag = " --server torchserve"
        header = (
            "| mode | run | load average | start (spawn to /ping) | first load (register version 1) "
            "| switch (set-default) | first answer | outcome |"
        )
        rule = "|---|---|---|---|---|---|---|---|"
    else:
        title = "KServe's model server: start and first load on a busy machine"
        flag = ""
        header = (
            "| mode | run | load average | start (spawn to /v2/health/live) | first load (alma-v1) | switch (alma) "
            "| outcome |"
        )
        rule = "|---|---|---|---|---|---|---|"
    cap = f" --before-cap {args.before_cap:g}" if args.before_cap != BEFORE_CAP_SECONDS else ""
    lines = [
        f"# {title}",
        "",
        f"Written by `python benchmarks/bench_serve_start_busy.py{flag} --busy {args.busy} --runs {args.runs}{cap}` "
        "(its docstring says what is measured). "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), {args.busy} busy loops at normal "
        f"priority, the server at serving.niceness {NICENESS}; the load average is the 1-minute one at each "
        "start's beginning (other jobs on the machine add to it).",
        "",
        header,
        rule,
    ]
    for index, row in enumerate(rows):
        answer = f" {shown(row.get('first_answer'))} |" if torchserve or triton else ""
        if triton:
            answer += f" {row.get('backend_niceness', '-')} |"
        lines.append(
            f"| {row['mode']} | {index // 2 + 1} | {row['load_average']} | {shown(row.get('start'))} | "
            f"{shown(row.get('first_load'))} | {shown(row.get('switch'))} |{answer} {row['outcome']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", choices=tuple(OUT_FILES), default="kserve", help="the server started")
    parser.add_argument("--busy", type=int, default=4, help="CPU-bound loops beside the server")
    parser.add_argument("--runs", type=int, default=2, help="starts per mode, alternating before and after")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds the loops run before each start")
    parser.add_argument(
        "--before-cap",
        type=float,
        default=BEFORE_CAP_SECONDS,
        help="seconds a 'before' start may take past the old 120 s",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: results/serve_start_busy.md (kserve), results/serve_start_busy_<server>.md (the others)",
    )
    args = parser.parse_args()
    out = args.out or RESULTS / OUT_FILES[args.server]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="serve-start-") as temp:
        if args.server == "torchserve":
            version = TorchServeVersion(Path(temp))
        elif args.server == "triton":
            triton_version = TritonVersion(Path(temp) / "model_store")
        else:
            store_root = model_store(Path(temp) / "model_store")
        for run in range(args.runs):
            for mode in ("before", "after"):
                loops = busy_loops(args.busy)
                try:
                    time.sleep(args.warmup)
                    folder = Path(temp) / f"{mode}{run}"
                    if args.server == "torchserve":
                        rows.append(one_torchserve_start(mode, folder, version, args.before_cap))
                    elif args.server == "triton":
                        rows.append(one_triton_start(mode, folder, triton_version, args.before_cap))
                    else:
                        rows.append(one_start(mode, folder, store_root, args.before_cap))
                finally:
                    for loop in loops:
                        loop.kill()
                        loop.wait()
                if args.server == "kserve":
                    (store_root / MODEL / DEFAULT_FILE).unlink(missing_ok=True)  # each start is a first one
                elif args.server == "triton":
                    triton_version.forget()
                print(rows[-1], flush=True)
                out.write_text(markdown(rows, args))  # so far: a run stopped midway leaves its rows
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
