"""The TorchServe that ``alma serve`` runs for users who do not run their own.

It is configured from the ``serving`` section: inference, management and metrics addresses from
the URLs (loopback by default), the model API on (the publisher registers versions), Prometheus
metrics mode, token authorization only with ``serving.token_auth``. Everything it writes (config,
logs, pid file, workers' sockets, ``key_file.json``) stays in one folder,
``<daemon.state_dir>/torchserve``.

It runs as its own process group, detached from the shell that started it, so that stopping it
stops the launcher, the JVM and every model worker together: ``torchserve --stop`` signals only
the JVM.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

from alma_daemon.config import Config
from serving.torchserve_publisher import TokenKeys

log = logging.getLogger(__name__)

PID_FILE = "torchserve.pid"
LOG_FILE = "torchserve.log"
KEY_FILE = "key_file.json"
START_TIMEOUT_SECONDS = 120.0
#: Seconds between two reports of the wait for ``/ping``.
PING_REPORT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 30.0
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


def torchserve_folder(config: Config) -> Path:
    return Path(config.daemon.state_dir) / "torchserve"


def key_file_path(config: Config) -> Path | None:
    """Where TorchServe's keys are read from; None when token authorization is off."""
    if config.serving.key_file:
        return Path(config.serving.key_file)
    return torchserve_folder(config) / KEY_FILE if config.serving.token_auth else None


class TorchServeProcess:
    """A TorchServe started in the background from, and recorded in, one folder."""

    def __init__(self, config: Config):
        self.serving = config.serving
        self.folder = torchserve_folder(config).resolve()
        self.pid_path = self.folder / PID_FILE
        self.log_path = self.folder / LOG_FILE
        #: TorchServe writes its keys into its working directory, this folder.
        self.key_path = self.folder / KEY_FILE
        self._process: subprocess.Popen | None = None

    def properties(self) -> dict[str, str]:
        """config.properties for this TorchServe."""
        grpc_inference, grpc_management = _free_ports(2)
        return {
            "inference_address": self.serving.inference_url,
            "management_address": self.serving.management_url,
            "metrics_address": self.serving.metrics_url,
            # The gRPC servers cannot be turned off; keep them on loopback, on ports nobody uses.
            "grpc_inference_address": "127.0.0.1",
            "grpc_management_address": "127.0.0.1",
            "grpc_inference_port": str(grpc_inference),
            "grpc_management_port": str(grpc_management),
            "enable_model_api": "true",
            "disable_token_authorization": "false" if self.serving.token_auth else "true",
            "metrics_mode": "prometheus",
            "model_store": str(self.folder / "model_store"),
        }

    def running_pid(self) -> int | None:
        """The process group recorded in the pid file, if a process of it still runs from this folder."""
        try:
            pgid = int(self.pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        # A stale pid file may name a group id the system has since given to something else.
        return pgid if any(str(self.folder) in " ".join(cmd) for cmd in _group_commands(pgid)) else None

    def start(self, timeout: float = START_TIMEOUT_SECONDS, report: Callable[[str], None] = lambda line: None) -> int:
        """Start TorchServe and wait until it answers ``/ping``; returns its process group id.

        ``report`` is told each stage (starting, waiting for ``/ping`` every :data:`PING_REPORT_SECONDS`,
        ready): on a busy host, at ``serving.niceness`` 19, TorchServe's JVM may take a minute or more."""
        require_torchserve()
        running = self.running_pid()
        if running is not None:
            raise RuntimeError(
                f"TorchServe already runs from {self.folder} (process group {running}); "
                "stop it with `alma serve --stop`"
            )
        management_host = urllib.parse.urlsplit(self.serving.management_url).hostname
        if management_host not in _LOOPBACK_HOSTS:
            log.warning(
                "TorchServe's management API will listen beyond loopback",
                extra={"management_url": self.serving.management_url},
            )
        config_path = self._write_config()
        report(f"starting TorchServe (niceness {self.serving.niceness}; its log: {self.log_path})")
        env = dict(os.environ)
        # TEMP is the JVM's temp dir (workers' sockets), TMPDIR moves TorchServe's pid file.
        env.update(
            TEMP=str(self.folder / "tmp"),
            TMPDIR=str(self.folder / "tmp"),
            LOG_LOCATION=str(self.folder / "logs"),
            METRICS_LOCATION=str(self.folder / "logs"),
        )
        with open(self.log_path, "ab") as log_file:
            process = subprocess.Popen(
                self._command(config_path),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                env=env,
                start_new_session=True,
            )
        self.pid_path.write_text(str(process.pid))
        self._process = process
        if self.serving.niceness:
            yield_to_training(process.pid, self.serving.niceness)
        try:
            self._wait_ready(process, timeout, report)
        except BaseException:
            self.stop()
            raise
        return process.pid

    def wait(self) -> int:
        """Block until the TorchServe this object started exits; returns its exit code."""
        if self._process is None:
            raise RuntimeError("wait() needs a TorchServe started by this process")
        return self._process.wait()

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> bool:
        """Stop the whole process group (SIGTERM, then SIGKILL); False if nothing was running."""
        pgid = self.running_pid()
        if pgid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _group_commands(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_commands(pgid):
            _signal_group(pgid, signal.SIGKILL)
        self.pid_path.unlink(missing_ok=True)
        return True

    def _write_config(self) -> Path:
        """Write ``config.properties`` and make the folders TorchServe writes into; a key file an
        earlier run left is removed, so that the readiness check waits for this run's keys."""
        for sub in ("model_store", "tmp", "logs"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.key_path.unlink(missing_ok=True)
        config_path = self.folder / "config.properties"
        config_path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        return config_path

    def _command(self, config_path: Path) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "ts.model_server",
            "--start",
            "--foreground",
            "--ncs",
            "--model-store",
            str(self.folder / "model_store"),
            "--ts-config",
            str(config_path),
        ]
        if self.serving.niceness:
            # Inherited by the JVM and every worker it forks: on a machine it shares with training,
            # serving (and the model loads of each swap) yields the cores (docs/serving.md).
            command = ["nice", "-n", str(self.serving.niceness), *command]
        return command

    def _wait_ready(self, process: subprocess.Popen, timeout: float, report: Callable[[str], None]) -> None:
        started = time.monotonic()
        deadline = started + timeout
        next_report = started + PING_REPORT_SECONDS
        ping = self.serving.inference_url.rstrip("/") + "/ping"
        while not self._answers_ping():
            if time.monotonic() >= next_report:
                waited = time.monotonic() - started
                report(f"waiting for TorchServe to answer {ping}: {waited:.0f} s so far, up to {timeout:.0f} s")
                next_report += PING_REPORT_SECONDS
            if process.poll() is not None:
                raise RuntimeError(
                    f"TorchServe exited with code {process.returncode}; see {self.log_path}:\n{_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"TorchServe did not answer /ping within {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        report(f"TorchServe answers {ping} after {time.monotonic() - started:.0f} s")

    def _answers_ping(self) -> bool:
        headers = {}
        if self.serving.token_auth:
            try:
                headers["Authorization"] = "Bearer " + TokenKeys(self.key_path).key("inference")
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                return False  # TorchServe has not written its keys yet
        request = urllib.request.Request(self.serving.inference_url.rstrip("/") + "/ping", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False


def require_torchserve() -> None:
    """Fail with what to install when TorchServe or its Java runtime is missing."""
    if importlib.util.find_spec("ts") is None:
        raise RuntimeError("TorchServe is not installed: pip install torchserve==0.12.0 torch-model-archiver==0.12.0")
    java_home = os.environ.get("JAVA_HOME")
    # The same lookup as TorchServe's launcher.
    java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        raise RuntimeError("TorchServe needs Java 17: no java on PATH or in $JAVA_HOME/bin")


def _group_commands(pgid: int) -> list[list[str]]:
    """Command lines of the live members of a process group; zombies do not count (a container's
    init may never reap them)."""
    commands = []
    for process in psutil.process_iter(["status", "cmdline"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                commands.append(process.info["cmdline"] or [])
        except (ProcessLookupError, psutil.Error):
            continue
    return commands


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def yield_to_training(pid: int, niceness: int) -> None:
    """Lower the scheduling priority of the session that ``pid`` leads (TorchServe's, with ``nice``).

    Linux's autogroup scheduling (on by default) shares the CPU fairly between sessions first and
    applies nice values only within one, so TorchServe, which runs in a session of its own, would
    still take half of the cores from training during each swap however nice its processes are.
    The session's own nice value, in ``/proc/<pid>/autogroup``, is what counts between sessions.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{niceness}\n")
    except OSError as err:
        log.info(
            "no autogroup scheduling here: only TorchServe's own nice value yields to training",
            extra={"pid": pid, "error": str(err)},
        )
