"""TorchServe as a local server: the one ``alma serve`` runs for users who do not run their own, and
the one the ``torchserve_server`` fixture and the benchmarks start.

It is configured from a ``serving`` section: inference, management and metrics addresses from the
URLs, gRPC on free loopback ports (its servers cannot be turned off), the model API on (the
publisher registers versions), Prometheus metrics mode, token authorization only with
``serving.token_auth``. Everything it writes (config, log, pid file, workers' sockets,
``key_file.json``) stays in one folder, ``<daemon.state_dir>/torchserve`` for ``alma serve``.

Its launcher, the JVM and one Python process per model worker are one process group, so stopping it
stops them all (``torchserve --stop`` signals only the JVM); docs/test-servers.md#torchserve has
what was found about its processes, folders and ports.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from alma_daemon.config import Config, ServingConfig
from alma_daemon.infra.priority import NICENESS_ENV
from alma_daemon.local_servers.processes import LOOPBACK, RecordedServer, ServerNotInstalled, free_ports
from serving.protocols.torchserve_keys import KEY_FILE, TokenKeys, torchserve_folder

log = logging.getLogger(__name__)

PID_FILE = "torchserve.pid"
START_TIMEOUT_SECONDS = 600.0
#: A start that uses no CPU this long is stuck, however long the cap (processes.CpuProgress).
STALL_SECONDS = 60.0
#: Seconds between two reports of the wait for ``/ping``.
PING_REPORT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 30.0
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


def _silent(line: str) -> None:
    pass


class TorchServeServer(RecordedServer):
    """TorchServe (``--foreground --ncs``) run from one folder, on the addresses of a ``serving`` section.

    Given the section (:meth:`for_config`: ``alma serve``), it listens where the section says, at its
    niceness, and records its process group in ``torchserve.pid``, so that another process finds it
    and stops it (``alma serve --stop``). Without one (the tests, the benchmarks) it takes free
    loopback ports, chosen again when another process takes one first, at niceness 0, without token
    authorization. It starts at normal priority, and each worker takes ``serving.niceness`` once its
    version is loaded (serving/runtimes/torchserve_handler.py), so a busy machine slows the start and
    the first load without stalling them; ``report`` is told each stage of a start, which waits as
    long as the server keeps using CPU (up to :data:`START_TIMEOUT_SECONDS`). Registered models are
    forgotten on restart; the model store's files stay.
    """

    name = "torchserve"
    pid_file = PID_FILE
    start_timeout = START_TIMEOUT_SECONDS
    stall_timeout = STALL_SECONDS
    lowers_own_priority = True

    def __init__(
        self, folder: Path, serving: ServingConfig | None = None, report: Callable[[str], None] = _silent
    ) -> None:
        self.serving = serving if serving is not None else ServingConfig(niceness=0)
        super().__init__(folder, [], choose_ports=serving is None, niceness=self.serving.niceness)
        self.report = report
        self.model_store = self.workdir / "model_store"
        self.config_path = self.workdir / "config.properties"
        #: TorchServe writes its keys into its working directory, this folder.
        self.key_path = self.workdir / KEY_FILE
        if serving is None:
            self.choose_ports()
        else:
            self._listen_where_configured()

    @classmethod
    def for_config(cls, config: Config, report: Callable[[str], None] = _silent) -> TorchServeServer:
        """The TorchServe of ``alma serve``: in ``<daemon.state_dir>/torchserve``, where ``serving`` says."""
        return cls(torchserve_folder(config), config.serving, report)

    @property
    def inference_url(self) -> str:
        return self.serving.inference_url

    @property
    def management_url(self) -> str:
        return self.serving.management_url

    @property
    def metrics_url(self) -> str:
        return self.serving.metrics_url

    @property
    def ping_url(self) -> str:
        return self.inference_url.rstrip("/") + "/ping"

    def choose_ports(self) -> None:
        """Five free ports: three addresses and two for gRPC (``config.properties`` names them)."""
        inference, management, metrics = free_ports(3)
        self.serving = dataclasses.replace(
            self.serving,
            inference_url=f"http://{LOOPBACK}:{inference}",
            management_url=f"http://{LOOPBACK}:{management}",
            metrics_url=f"http://{LOOPBACK}:{metrics}",
        )
        self._listen_where_configured()
        self._write_config()

    def _listen_where_configured(self) -> None:
        # The gRPC servers cannot be turned off: they take free ports, which are not checked for
        # readiness (TorchServe fails at start if they are taken).
        self.ports = [_port(url) for url in (self.inference_url, self.management_url, self.metrics_url)]
        self.grpc_ports = free_ports(2)

    def _write_config(self) -> None:
        """Write ``config.properties`` and make the folders TorchServe writes into."""
        # TorchServe keeps its pid file and its workers' Unix sockets in the temp directory and
        # refuses to start while another instance's pid file there names a live process.
        for sub in ("model_store", "tmp", "logs"):
            (self.workdir / sub).mkdir(exist_ok=True)
        grpc_inference, grpc_management = self.grpc_ports
        properties = {
            "inference_address": self.inference_url,
            "management_address": self.management_url,
            "metrics_address": self.metrics_url,
            "grpc_inference_address": LOOPBACK,
            "grpc_management_address": LOOPBACK,
            "grpc_inference_port": str(grpc_inference),
            "grpc_management_port": str(grpc_management),
            "enable_model_api": "true",
            "disable_token_authorization": "false" if self.serving.token_auth else "true",
            "metrics_mode": "prometheus",
            "model_store": str(self.model_store),
        }
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "ts.model_server",
            "--start", "--foreground", "--ncs",
            "--model-store", str(self.model_store),
            "--ts-config", str(self.config_path),
        ]  # fmt: skip
        # At normal priority: the JVM's start and a version's first load do not wait for spare CPU on
        # a busy machine. Each worker lowers its own once its version is loaded
        # (serving/runtimes/torchserve_handler.py).
        return command

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # TEMP is the JVM's temp dir (workers' sockets), TMPDIR moves TorchServe's pid file; the
        # launcher writes logs/ into its working directory, this folder, unless told otherwise.
        logs = str(self.workdir / "logs")
        env.update(TEMP=str(self.workdir / "tmp"), TMPDIR=str(self.workdir / "tmp"))
        env.update(LOG_LOCATION=logs, METRICS_LOCATION=logs)
        if self.niceness:
            env[NICENESS_ENV] = str(self.niceness)
        return env

    def start(self) -> None:
        """Start TorchServe and wait until it answers ``/ping``; refused while one runs from this folder."""
        require_torchserve()
        self.refuse_second_start("TorchServe", "alma serve --stop")
        if urllib.parse.urlsplit(self.management_url).hostname not in _LOOPBACK_HOSTS:
            log.warning(
                "TorchServe's management API will listen beyond loopback", extra={"management_url": self.management_url}
            )
        self._write_config()
        # The readiness check waits for this run's keys, not those an earlier run left.
        self.key_path.unlink(missing_ok=True)
        priority = (
            f"normal priority, niceness {self.niceness} once a version is loaded" if self.niceness else "niceness 0"
        )
        self.report(f"starting TorchServe ({priority}; its log: {self.log_path})")
        super().start()

    def wait_ready(self, deadline: float) -> None:
        began = next_report = time.monotonic()

        def answers() -> bool:
            nonlocal next_report
            now = time.monotonic()
            if now - next_report >= PING_REPORT_SECONDS:
                self.report(
                    f"waiting for TorchServe to answer {self.ping_url}: {now - began:.0f} s so far, "
                    f"up to {self.start_timeout:.0f} s"
                )
                next_report += PING_REPORT_SECONDS
            return self.answers_ping()

        self.wait_until(answers, f"answering {self.ping_url}", deadline)
        super().wait_ready(deadline)  # and the ports that answer are its own
        self.report(f"TorchServe answers {self.ping_url} after {time.monotonic() - began:.0f} s")

    def answers_ping(self) -> bool:
        headers = {}
        if self.serving.token_auth:
            try:
                headers["Authorization"] = "Bearer " + TokenKeys(self.key_path).key("inference")
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                return False  # TorchServe has not written its keys yet
        request = urllib.request.Request(self.ping_url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """Stop the JVM and workers, then the launcher; SIGKILL after ``timeout``."""
        super().stop(timeout)


def _port(url: str) -> int:
    parts = urllib.parse.urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def java_available() -> bool:
    # The same lookup as TorchServe's launcher.
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    return java is not None and os.access(java, os.X_OK)


def require_torchserve() -> None:
    """Fail with what to install when TorchServe or its Java runtime is missing."""
    if importlib.util.find_spec("ts") is None:
        raise ServerNotInstalled(
            "--kind torchserve (serving.kind): TorchServe is not installed here: pip install 'alma-daemon[serving]' "
            "(torchserve==0.12.0 torch-model-archiver==0.12.0), or start KServe's model server with --kind kserve"
        )
    if not java_available():
        raise ServerNotInstalled(
            "--kind torchserve (serving.kind): TorchServe needs Java 17: no java on PATH or in $JAVA_HOME/bin; "
            "install a Java 17 runtime, or start KServe's model server with --kind kserve"
        )
