"""``alma serve``: start (or ``--stop``) a model server configured for the daemon: TorchServe, KServe's
model server (``--kind kserve``) or Triton (``--kind triton``).

It runs in the background by default; ``--foreground`` keeps the command attached to it (a
container's main process) and stops it on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING

from alma_daemon.cli import add_config_arguments, add_embedded_argument, config_overrides

if TYPE_CHECKING:
    from collections.abc import Callable

    from alma_daemon.config import Config
    from alma_daemon.local_servers.processes import RecordedServer

#: What ``--kind`` starts, by its ``serving.kind``; the kind's name as messages say it.
KINDS = {"torchserve": "TorchServe", "kserve": "KServe's model server", "triton": "Triton"}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start a model server for the daemon in the background: TorchServe, KServe or Triton (or --stop it)",
    )
    add_config_arguments(parser)
    add_embedded_argument(parser)
    parser.add_argument(
        "--kind",
        choices=sorted(KINDS),
        help="the server to start (default: serving.kind where it names one of them, else torchserve)",
    )
    parser.add_argument("--stop", action="store_true", help="stop the server of this kind started by `alma serve`")
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached until the server exits; SIGTERM or Ctrl-C stops it (containers)",
    )
    parser.set_defaults(func=run)


def server_for(kind: str, config: Config) -> tuple[RecordedServer, list[tuple[str, str]]]:
    """The server ``alma serve --kind <kind>`` runs for ``config``, and the rows that describe it once started."""
    report = lambda line: print(f"alma serve: {line}", file=sys.stderr, flush=True)  # noqa: E731
    serving = config.serving
    if kind == "kserve":
        from alma_daemon.local_servers.kserve import KServeServer

        kserve = KServeServer.for_config(config, report=report)
        return kserve, [
            ("listens on", f"{kserve.host}:{kserve.port}"),
            ("inference", f"{serving.inference_url}/v2/models/{serving.model_name}/infer"),
            ("repository", f"{serving.inference_url}/v2/repository/models/<name>/load (with the token only)"),
            ("token", f"{kserve.token_file} (serving.repository_token_file)"),
            ("metrics", f"{serving.inference_url}/metrics"),
            ("models", f"{kserve.store_root / serving.model_name} (versions load as {serving.model_name}-v<N>)"),
            ("log", str(kserve.log_path)),
            ("folder", str(kserve.workdir)),
        ]
    if kind == "triton":
        return _triton(config, report)
    from alma_daemon.local_servers.torchserve import TorchServeServer

    torchserve = TorchServeServer.for_config(config, report=report)
    rows = [
        ("inference", serving.inference_url),
        ("management", serving.management_url),
        ("metrics", serving.metrics_url.rstrip("/") + "/metrics"),
        ("log", str(torchserve.log_path)),
        ("folder", str(torchserve.workdir)),
    ]
    if serving.token_auth:
        rows.append(("keys", str(torchserve.key_path)))
    # A worker loads a version when the daemon registers it: at niceness 19 on a busy host, the first
    # can take tens of seconds, which the daemon's log tells as it goes.
    rows.append(("workers", f"{serving.workers} per version, started as the daemon registers each one"))
    return torchserve, rows


def _triton(config: Config, report: Callable[[str], None]) -> tuple[RecordedServer, list[tuple[str, str]]]:
    """Triton over the daemon's model store (alma_daemon/local_servers/triton.py)."""
    from alma_daemon.local_servers.triton import TritonServer

    serving = config.serving
    triton = TritonServer.for_config(config, report=report)
    return triton, [
        ("listens on", f"{triton.host}:{triton.port}"),
        ("inference", f"{serving.inference_url}/v2/models/{serving.model_name}/infer"),
        ("repository", f"{serving.inference_url}/v2/repository/models/<name>/load (with the token only)"),
        ("token", f"{triton.token_file} (serving.repository_token_file)"),
        ("models", f"{triton.repository} (the publisher writes a folder per name: {serving.model_name}-v<N>)"),
        ("log", str(triton.log_path)),
        ("folder", str(triton.workdir)),
    ]


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config

    config = load_config(args.config, config_overrides(args))
    kind = args.kind or (config.serving.kind if config.serving.kind in KINDS else "torchserve")
    process, rows = server_for(kind, config)
    name = KINDS[kind]
    if args.stop:
        running = process.recorded_pid() is not None
        process.stop()
        print(f"{name} stopped" if running else f"no {name} running from {process.workdir}")
        return 0
    if config.serving.kind != kind:
        print(
            f"note: serving.kind is {config.serving.kind!r}: the daemon publishes to {name} only with "
            f"serving.kind: {kind}",
            file=sys.stderr,
        )
    if args.foreground:
        process.start()
    else:
        process.start_detached()  # it outlives this command
    print(f"{name} started (process group {process.pid})")
    for label, value in rows:
        print(f"{label:<11} {value}", flush=True)
    if not args.foreground:
        return 0
    # SIGTERM (docker stop) takes the same way out as Ctrl-C, so the whole group is stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        process.stop()
