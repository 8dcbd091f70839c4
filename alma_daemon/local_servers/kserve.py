"""KServe's model server as a local server: the one ``alma serve --kind kserve`` runs, and the one the
``kserve_server`` fixture and the benchmarks start.

It runs :mod:`serving.kserve_server` over the daemon's model store (``daemon.checkpoint_dir``) and
model (``serving.model_name``), on the port of ``serving.inference_url`` (KServe binds every
interface), at ``serving.niceness``; its log and pid file stay in one folder,
``<daemon.state_dir>/kserve`` for ``alma serve``. A restarted server serves the default version it
finds recorded in the model store before the daemon asks anything of it.
"""

from __future__ import annotations

import importlib.util
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from alma_daemon.config import Config
from alma_daemon.local_servers.processes import LOOPBACK, RecordedServer, free_port, http_ok

PID_FILE = "kserve.pid"
#: Importing torch and KServe takes a few seconds; tens at niceness 19 on a busy host.
START_TIMEOUT_SECONDS = 120.0


def _silent(line: str) -> None:
    pass


class KServeServer(RecordedServer):
    """KServe's model server over one model of a model store.

    Given a port (:meth:`for_config`: ``alma serve --kind kserve``), it listens there and can be found
    and stopped by another process through its pid file; without one (the tests, the benchmarks) it
    takes a free port, chosen again when another process takes it first.
    """

    name = "kserve"
    pid_file = PID_FILE
    start_timeout = START_TIMEOUT_SECONDS

    def __init__(
        self,
        folder: Path,
        store_root: Path,
        model: str = "alma",
        *,
        port: int | None = None,
        niceness: int = 0,
        device: str = "auto",
        report: Callable[[str], None] = _silent,
    ) -> None:
        super().__init__(folder, [port or free_port()], choose_ports=port is None, niceness=niceness)
        self.store_root = Path(store_root).resolve()
        self.model = model
        self.device = device
        self.report = report

    @classmethod
    def for_config(cls, config: Config, report: Callable[[str], None] = _silent) -> KServeServer:
        """The server of ``alma serve --kind kserve``: in ``<daemon.state_dir>/kserve``, where ``serving`` says."""
        url = urllib.parse.urlsplit(config.serving.inference_url)
        return cls(
            Path(config.daemon.state_dir) / "kserve",
            Path(config.daemon.checkpoint_dir),
            config.serving.model_name,
            port=url.port or (443 if url.scheme == "https" else 80),
            niceness=config.serving.niceness,
            report=report,
        )

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def inference_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def choose_ports(self) -> None:
        self.ports = [free_port()]

    def command(self) -> list[str]:
        return self.niced(
            [
                sys.executable, "-m", "serving.kserve_server",
                "--model-store", str(self.store_root),
                "--model-name", self.model,
                "--http-port", str(self.port),
                "--device", self.device,
            ]
        )  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it answers ``/v2/health/live``; refused while one runs from this folder."""
        require_kserve()
        self.refuse_second_start("KServe's model server", "alma serve --kind kserve --stop")
        self.report(f"starting KServe's model server (niceness {self.niceness}; its log: {self.log_path})")
        super().start()

    def wait_ready(self, deadline: float) -> None:
        self.wait_until(lambda: http_ok(f"{self.inference_url}/v2/health/live"), "answering /v2/health/live", deadline)
        super().wait_ready(deadline)  # and the port that answers is its own


def require_kserve() -> None:
    """Fail with what to install when KServe's model server is missing."""
    if importlib.util.find_spec("kserve") is None:
        raise RuntimeError("KServe's model server is not installed: pip install 'alma-daemon[kserve]' (kserve==0.21.0)")
