"""``alma serve``: start (or ``--stop``) a TorchServe configured for the daemon.

It runs in the background by default; ``--foreground`` keeps the command attached to it (a
container's main process) and stops it on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys

from alma_daemon.cli import add_config_arguments, add_embedded_argument, config_overrides


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="start a TorchServe for the daemon in the background (or --stop it)")
    add_config_arguments(parser)
    add_embedded_argument(parser)
    parser.add_argument("--stop", action="store_true", help="stop the TorchServe started by `alma serve`")
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached until TorchServe exits; SIGTERM or Ctrl-C stops it (containers)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.local_servers.torchserve import TorchServeServer

    config = load_config(args.config, config_overrides(args))
    process = TorchServeServer.for_config(
        config, report=lambda line: print(f"alma serve: {line}", file=sys.stderr, flush=True)
    )
    if args.stop:
        running = process.recorded_pid() is not None
        process.stop()
        print("TorchServe stopped" if running else f"no TorchServe running from {process.workdir}")
        return 0
    if config.serving.kind != "torchserve":
        print(
            f"note: serving.kind is {config.serving.kind!r}: the daemon publishes to TorchServe only with "
            "serving.kind: torchserve",
            file=sys.stderr,
        )
    if args.foreground:
        process.start()
    else:
        process.start_detached()  # it outlives this command
    serving = config.serving
    rows = [
        ("inference", serving.inference_url),
        ("management", serving.management_url),
        ("metrics", serving.metrics_url.rstrip("/") + "/metrics"),
        ("log", str(process.log_path)),
        ("folder", str(process.workdir)),
    ]
    if serving.token_auth:
        rows.append(("keys", str(process.key_path)))
    # A worker loads a version when the daemon registers it: at niceness 19 on a busy host, the first
    # can take tens of seconds, which the daemon's log tells as it goes.
    rows.append(("workers", f"{serving.workers} per version, started as the daemon registers each one"))
    print(f"TorchServe started (process group {process.pid})")
    for name, value in rows:
        print(f"{name:<11} {value}", flush=True)
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
