"""Start and first-load time of KServe's model server, as ``alma serve --kind kserve`` runs it, on a busy
machine (issue 51): before and after it started at normal priority.

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

Run from the repository root (needs kserve==0.21.0)::

    python benchmarks/bench_serve_start_busy.py            # writes benchmarks/results/serve_start_busy.md
    python benchmarks/bench_serve_start_busy.py --busy 0   # the same at rest
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from alma_daemon.config import build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.learners import build_learner
from alma_daemon.local_servers.kserve import KServeServer
from alma_daemon.local_servers.processes import ServerStartError
from serving.oip_client import OipClient
from serving.oip_names import DEFAULT_FILE, versioned_name, write_default
from serving.oip_token import RepositoryToken

MODEL = "alma"
NICENESS = 19
#: ``alma serve``'s wait before issue 51.
OLD_TIMEOUT_SECONDS = 120.0
RESULTS = Path(__file__).parent / "results"


class NicedFromTheStart(KServeServer):
    """The server as ``alma serve`` ran it before issue 51: ``nice`` and autogroup at spawn, fixed wait."""

    lowers_own_priority = False  # RecordedServer.niced and spawned apply the niceness at once
    stall_timeout = None

    def command(self) -> list[str]:
        return self.niced(super().command())


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]


def model_store(root: Path) -> Path:
    """A model store holding version 1 of an MNIST MLP (untrained: its load costs what a trained one's does)."""
    config = build_config({"learner": {"name": "sm", "width": 64}})
    learner = build_learner("sm", MNIST_TASK, config.learner, seed=0)
    CheckpointStore(root, MODEL).save(learner, 1, {"val_error": 0.5, "kind": "finetune"})
    return root


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
    started = row["start"]
    late = mode == "before" and isinstance(started, float) and started > OLD_TIMEOUT_SECONDS
    row["outcome"] = f"would have failed (past {OLD_TIMEOUT_SECONDS:.0f} s)" if late else "started"
    return row


def markdown(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    def shown(value: object, unit: str = " s") -> str:
        return "-" if value is None else f"{value}{unit}"

    lines = [
        "# KServe's model server: start and first load on a busy machine",
        "",
        f"Written by `python benchmarks/bench_serve_start_busy.py --busy {args.busy} --runs {args.runs}` "
        "(its docstring says what is measured). "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), {args.busy} busy loops at normal "
        f"priority, the server at serving.niceness {NICENESS}; the load average is the 1-minute one at each "
        "start's beginning (other jobs on the machine add to it).",
        "",
        "| mode | run | load average | start (spawn to /v2/health/live) | first load (alma-v1) | switch (alma) | outcome |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, row in enumerate(rows):
        lines.append(
            f"| {row['mode']} | {index // 2 + 1} | {row['load_average']} | {shown(row.get('start'))} | "
            f"{shown(row.get('first_load'))} | {shown(row.get('switch'))} | {row['outcome']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=4, help="CPU-bound loops beside the server")
    parser.add_argument("--runs", type=int, default=2, help="starts per mode, alternating before and after")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds the loops run before each start")
    parser.add_argument(
        "--before-cap", type=float, default=180.0, help="seconds a 'before' start may take past the old 120 s"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_start_busy.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-start-") as temp:
        store_root = model_store(Path(temp) / "model_store")
        for run in range(args.runs):
            for mode in ("before", "after"):
                loops = busy_loops(args.busy)
                try:
                    time.sleep(args.warmup)
                    rows.append(one_start(mode, Path(temp) / f"{mode}{run}", store_root, args.before_cap))
                finally:
                    for loop in loops:
                        loop.kill()
                        loop.wait()
                (store_root / MODEL / DEFAULT_FILE).unlink(missing_ok=True)  # each start is a first one
                print(rows[-1], flush=True)
    args.out.write_text(markdown(rows, args))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
