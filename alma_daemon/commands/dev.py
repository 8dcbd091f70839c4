"""``alma dev up|down|status``: a local stack without Docker, for ``alma run`` with real servers.

``up`` starts Redis, the Tansu broker (Kafka protocol) and Prometheus, which scrapes the daemon's
metrics port, on free loopback ports, from what ``scripts/setup.sh`` installed; each runs detached
as its own process group, its data and log under ``<dir>/<server>/``. It records their pids and
addresses in ``<dir>/stack.json``, writes ``<dir>/service.yaml`` (``examples/service.yaml``, or
``--config``, with the stack's addresses and a daemon folder of its own) and prints the command that
uses it; ``--serving kserve`` also starts KServe's model server over the daemon's model store and
points the daemon's publisher at it. ``status`` says which are up; ``down`` stops them by pid, and is safe when they are gone.

The servers are the classes the integration tests start (alma_daemon/local_servers/).
Every ``up`` starts afresh: the broker keeps its topics in memory, so a Redis or a daemon folder
kept from an earlier stack would point past the end of topics that no longer exist.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from alma_daemon.core.atomic_json import write_json_atomic, write_text_atomic
from alma_daemon.local_servers.processes import (
    LOOPBACK,
    ServerProcess,
    free_port,
    port_open,
    process_started,
    stop_group,
)
from alma_daemon.local_servers.servers import KafkaBroker, PrometheusServer, RedisServer

DEFAULT_DIR = "runs/dev"
STACK_FILE = "stack.json"
CONFIG_FILE = "service.yaml"
#: The config ``up`` points at the stack when no ``--config`` is given (where the file exists).
EXAMPLE = Path("examples/service.yaml")
#: The folders of an earlier stack that ``up`` empties: the servers' data and the daemon's.
DATA_FOLDERS = ("redis", "kafka", "prometheus", "kserve", "daemon")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dev", help="a local stack without Docker: Redis, a Kafka broker and Prometheus on free loopback ports"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser(
        "up",
        help="start Redis, the Tansu broker and Prometheus (scraping the daemon) and write a config that uses them",
    )
    up.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        help=f"the config to point at the stack (default: {EXAMPLE} where it exists, else the built-in defaults)",
    )
    up.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a key of the written config, e.g. --set stream.megabatches=20 (repeatable)",
    )
    up.add_argument(
        "--serving",
        choices=["kserve"],
        help="also start a model server over the daemon's model store and publish to it: kserve (KServe's "
        "model server, the kserve extra)",
    )
    status = actions.add_parser("status", help="say which of the stack's servers are up")
    down = actions.add_parser("down", help="stop the stack's servers (by their pids; safe when they are gone)")
    for action, func in ((up, run_up), (status, run_status), (down, run_down)):
        action.add_argument(
            "--dir", default=DEFAULT_DIR, metavar="DIR", help=f"the stack's folder (default: {DEFAULT_DIR})"
        )
        action.set_defaults(func=func)


# -- the stack file -------------------------------------------------------------------------------


def read_stack(folder: Path) -> dict[str, Any] | None:
    path = folder / STACK_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def server_entry(name: str, server: ServerProcess, address: str, port: int) -> dict[str, Any]:
    assert server.pid is not None
    return {
        "name": name,
        "pid": server.pid,
        "started": process_started(server.pid),
        "stop_signal": int(server.stop_signal),
        "address": address,
        "port": port,
        "log": str(server.log_path),
    }


def alive(entry: dict[str, Any]) -> bool:
    """Whether the process ``up`` started still runs (not a later one that reuses its pid)."""
    started = process_started(entry["pid"])
    return started is not None and started == entry["started"]


def server_state(entry: dict[str, Any]) -> str:
    if not alive(entry):
        return "down"
    return "up" if port_open(entry["port"]) else "not answering"


# -- up -------------------------------------------------------------------------------------------


def run_up(args: argparse.Namespace) -> int:
    from alma_daemon.config import load_config
    from alma_daemon.config.sections import MODEL_STORE

    folder = Path(args.dir)
    stack = read_stack(folder)
    if stack is not None and any(alive(entry) for entry in stack["servers"]):
        print(
            f"alma dev up: error: a local stack is already up under {folder} (alma dev status --dir {folder}); "
            f"stop it first: alma dev down --dir {folder}",
            file=sys.stderr,
        )
        return 1
    source = Path(args.config) if args.config else (EXAMPLE if EXAMPLE.is_file() else None)
    config = load_config(source, args.overrides)  # a bad file or --set fails here, before any server starts
    check_no_daemon(folder / "daemon" / MODEL_STORE)
    for name in DATA_FOLDERS:
        shutil.rmtree(folder / name, ignore_errors=True)
    stack = start_stack(folder, config.serving.model_name if args.serving == "kserve" else None)
    config_path = folder / CONFIG_FILE
    write_text_atomic(config_path, stack_config_text(stack, folder, source, args.overrides))
    load_config(config_path)  # what it wrote loads (it always should)
    print(describe_up(stack, folder, config_path, source))
    return 0


def check_no_daemon(model_store: Path) -> None:
    """Refuse to empty the folder of a daemon that still runs on it (it holds its store's lock)."""
    from alma_daemon.core.checkpoints import CheckpointStore
    from alma_daemon.service.store_lock import StreamTaken, hold_store_lock

    if not model_store.is_dir():
        return
    for model in sorted(path for path in model_store.iterdir() if path.is_dir()):
        try:
            with hold_store_lock(CheckpointStore(model_store, model.name)):
                pass
        except StreamTaken as exc:
            raise StreamTaken(
                f"{exc}: `alma dev up` starts afresh and would empty its folder; stop that daemon first"
            ) from None


def start_stack(folder: Path, kserve_model: str | None = None) -> dict[str, Any]:
    """Start the servers detached (with KServe's model server serving ``kserve_model`` where one is
    named), and record them in ``<folder>/stack.json``; on a failure, stop those already started and raise."""
    from alma_daemon.config.sections import MODEL_STORE
    from alma_daemon.local_servers.kserve import KServeServer

    metrics_port = free_port()  # the daemon's, for Prometheus to scrape (taken by `alma run` later)
    started: list[ServerProcess] = []
    entries: list[dict[str, Any]] = []
    try:
        redis = RedisServer(folder / "redis")
        started.append(redis)
        redis.start_detached()
        entries.append(server_entry("redis", redis, redis.url, redis.port))
        kafka = KafkaBroker(folder / "kafka")
        started.append(kafka)
        kafka.start_detached()
        entries.append(server_entry("kafka", kafka, kafka.bootstrap_servers, kafka.port))
        prometheus = PrometheusServer(folder / "prometheus", [f"{LOOPBACK}:{metrics_port}"])
        started.append(prometheus)
        prometheus.start_detached()
        entries.append(server_entry("prometheus", prometheus, prometheus.url, prometheus.port))
        if kserve_model is not None:
            kserve = KServeServer(folder / "kserve", folder / "daemon" / MODEL_STORE, kserve_model)
            started.append(kserve)
            kserve.start_detached()
            # Its repository answers the token it wrote in its folder: the daemon's config names the file.
            entries.append(
                {
                    **server_entry("kserve", kserve, kserve.inference_url, kserve.port),
                    "token_file": str(kserve.token_file),
                }
            )
    except BaseException:
        for server in reversed(started):
            server.stop()
        raise
    stack = {"servers": entries, "metrics": f"{LOOPBACK}:{metrics_port}", "config": str(folder / CONFIG_FILE)}
    write_json_atomic(folder / STACK_FILE, stack)
    return stack


def stack_settings(stack: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The config keys that point a daemon (and its producer and status) at the stack."""
    from alma_daemon.config.sections import MODEL_STORE

    servers = {entry["name"]: entry for entry in stack["servers"]}
    daemon = (folder / "daemon").resolve()
    return {
        "redis.url": servers["redis"]["address"],
        "kafka.transport": "kafka",
        "kafka.bootstrap_servers": servers["kafka"]["address"],
        "metrics.host": LOOPBACK,
        "metrics.port": int(stack["metrics"].rsplit(":", 1)[1]),
        "daemon.state_dir": str(daemon),
        "daemon.checkpoint_dir": str(daemon / MODEL_STORE),
        **(
            {
                "serving.kind": "kserve",
                "serving.inference_url": servers["kserve"]["address"],
                "serving.repository_token_file": servers["kserve"]["token_file"],
            }
            if "kserve" in servers
            else {}
        ),
    }


def stack_config_text(stack: dict[str, Any], folder: Path, source: Path | None, overrides: list[str]) -> str:
    from alma_daemon.config.loading import parse_override, read_yaml, set_dotted

    data = read_yaml(source) if source is not None else {}
    for key, value in stack_settings(stack, folder).items():
        set_dotted(data, key, value)
    for text in overrides:
        set_dotted(data, *parse_override(text))
    origin = str(source) if source is not None else "the built-in defaults"
    header = (
        f"# Written by `alma dev up`: {origin} pointed at the local stack of {folder} (Redis, the Tansu broker,\n"
        "# Prometheus scraping metrics.port). The next `alma dev up` writes it again, with new ports.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def describe_up(stack: dict[str, Any], folder: Path, config_path: Path, source: Path | None) -> str:
    servers = {entry["name"]: entry for entry in stack["servers"]}
    notes = {
        "redis": "",
        "kafka": "  (Tansu; topics in memory)",
        "prometheus": f"  (scrapes the daemon's metrics at {stack['metrics']})",
        "kserve": "  (KServe's model server over the daemon's model store)",
    }
    rows = [f"  {name:<11} {entry['address']:<28} pid {entry['pid']}{notes[name]}" for name, entry in servers.items()]
    settings = stack_settings(stack, folder)
    sets = " ".join(f"--set {key}={settings[key]}" for key in ("redis.url", "kafka.bootstrap_servers", "metrics.port"))
    origin = f"{source} with these addresses" if source is not None else "the built-in defaults with these addresses"
    commands = [
        (f"alma run --config {config_path}", "the daemon"),
        (f"alma replay --config {config_path} --rate 2/s", "the producer, in another shell"),
        (f"alma status --config {config_path}", "what the daemon is doing"),
        (f"{servers['prometheus']['address']}/graph?g0.expr=alma_cumulative_error", "Prometheus, once the daemon runs"),
    ]
    width = max(len(command) for command, _ in commands)
    return "\n".join(
        [
            f"alma dev: a local stack is up (pids in {folder / STACK_FILE}; logs in {folder}/<server>/):",
            *rows,
            f"config: {config_path} ({origin}; the daemon's folder {settings['daemon.state_dir']})",
            "",
            *(f"  {command:<{width}}  # {comment}" for command, comment in commands),
            "",
            f"Another config on this stack: {sets}",
            f"Stop it: alma dev down{_dir_flag(folder)}",
        ]
    )


def _dir_flag(folder: Path) -> str:
    return "" if folder == Path(DEFAULT_DIR) else f" --dir {folder}"


# -- status ---------------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    stack = read_stack(folder)
    if stack is None:
        print(f"no local stack under {folder}: start one with alma dev up{_dir_flag(folder)}")
        return 1
    states = [server_state(entry) for entry in stack["servers"]]
    rows = [
        (
            entry["name"],
            state,
            entry["address"],
            f"pid {entry['pid']}" + ("" if state == "up" else f"; log {entry['log']}"),
        )
        for entry, state in zip(stack["servers"], states)
    ]
    metrics_port = int(stack["metrics"].rsplit(":", 1)[1])
    if port_open(metrics_port):
        rows.append(("daemon", "up", stack["metrics"], "its metrics, which prometheus scrapes"))
    else:
        rows.append(("daemon", "not running", stack["metrics"], f"start it: alma run --config {stack['config']}"))
    width = max(len(state) for _, state, _, _ in rows)
    for name, state, address, detail in rows:
        print(f"{name:<11} {state:<{width}}  {address:<28} {detail}")
    print(f"{'config':<11} {stack['config']}")
    return 0 if all(state == "up" for state in states) else 1


# -- down -----------------------------------------------------------------------------------------


def run_down(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    stack = read_stack(folder)
    if stack is None:
        print(f"no local stack under {folder}: nothing to stop")
        return 0
    for entry in reversed(stack["servers"]):
        print(stop_server(entry))
    (folder / STACK_FILE).unlink(missing_ok=True)
    metrics_port = int(stack["metrics"].rsplit(":", 1)[1])
    if port_open(metrics_port):
        print(f"a daemon still serves metrics at {stack['metrics']}: stop it too (Ctrl-C in its shell)")
    print(f"data and logs stay under {folder}; the next alma dev up starts afresh")
    return 0


def stop_server(entry: dict[str, Any]) -> str:
    """Stop one server of the stack by its pid (its whole process group), if it still runs."""
    if not alive(entry):
        return f"{entry['name']} (pid {entry['pid']}) was not running"
    stop_group(entry["pid"], signal.Signals(entry["stop_signal"]))
    return f"stopped {entry['name']} (pid {entry['pid']})"
