"""KServe's model server as a local server: the one ``alma serve --kind kserve`` runs, and the one the
``kserve_server`` fixture and the benchmarks start.

It runs :mod:`serving.runtimes.kserve_server` over the daemon's model store (``daemon.checkpoint_dir``) and
model (``serving.model_name``), on the port of ``serving.inference_url`` and the address of
``serving.bind_host`` (else the URL's host: loopback by default). Its model repository API answers
only the token of ``serving.repository_token_file`` (:mod:`serving.protocols.repository_token`), which it writes in
its folder where the key is unset. It starts at normal priority and takes ``serving.niceness`` once
it serves a version, and the wait for it lasts as long as it keeps using CPU (up to
:data:`START_TIMEOUT_SECONDS`): on a busy machine its start and first load do not wait for spare CPU
(benchmarks/results/serve_start_busy.md). Its log, pid file and token stay in one folder,
``<daemon.state_dir>/kserve`` for ``alma serve``. A restarted server serves the default version it
finds recorded in the model store before the daemon asks anything of it.
"""

from __future__ import annotations

import errno
import importlib.util
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from alma_daemon.config import Config, ConfigError
from alma_daemon.local_servers.processes import LOOPBACK, RecordedServer, ServerNotInstalled, free_port, http_ok
from serving.protocols.repository_token import TOKEN_FILE, kserve_folder, read_token, write_token

PID_FILE = "kserve.pid"
#: The longest wait for a start that keeps using CPU: minutes on a machine whose cores training holds.
START_TIMEOUT_SECONDS = 600.0
#: A start that used no CPU for this long is stuck (blocked, deadlocked), however long it may still wait.
STALL_SECONDS = 60.0
#: Seconds between two reports of the wait for ``/v2/health/live``.
REPORT_SECONDS = 10.0
#: Addresses that mean every interface, and the one the server is asked at on this machine.
_EVERY_INTERFACE = {"0.0.0.0": LOOPBACK, "": LOOPBACK, "::": "::1"}
#: What a message says to do about an address that cannot be listened on.
_HOST_FIX = "set serving.bind_host to 127.0.0.1 (this machine only) or 0.0.0.0 (every interface, in a container)"


def _silent(line: str) -> None:
    pass


class KServeServer(RecordedServer):
    """KServe's model server over one model of a model store.

    Given a port (:meth:`for_config`: ``alma serve --kind kserve``), it listens there and can be found
    and stopped by another process through its pid file; without one (the tests, the benchmarks) it
    takes a free loopback port, chosen again when another process takes it first. Its token is
    ``token_file`` where given (a file someone provides, which must exist), else
    ``<folder>/repository_token``, written at its first start.
    """

    name = "kserve"
    pid_file = PID_FILE
    start_timeout = START_TIMEOUT_SECONDS
    stall_timeout = STALL_SECONDS
    lowers_own_priority = True

    def __init__(
        self,
        folder: Path,
        store_root: Path,
        model: str = "alma",
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        token_file: Path | None = None,
        niceness: int = 0,
        device: str = "auto",
        report: Callable[[str], None] = _silent,
    ) -> None:
        super().__init__(folder, [port or free_port()], choose_ports=port is None, niceness=niceness)
        self.store_root = Path(store_root).resolve()
        self.model = model
        self.host = host
        #: The config key messages name for the address: set by :meth:`for_config`.
        self.host_key = "serving.bind_host"
        self.port_given = port is not None
        self.token_named = token_file is not None
        self.token_file = Path(token_file) if token_file is not None else self.workdir / TOKEN_FILE
        self.device = device
        self.report = report

    @classmethod
    def for_config(cls, config: Config, report: Callable[[str], None] = _silent) -> KServeServer:
        """The server of ``alma serve --kind kserve``: in ``<daemon.state_dir>/kserve``, where ``serving`` says."""
        serving = config.serving
        url = urllib.parse.urlsplit(serving.inference_url)
        server = cls(
            kserve_folder(config),
            Path(config.daemon.checkpoint_dir),
            serving.model_name,
            port=url.port or (443 if url.scheme == "https" else 80),
            host=serving.bind_host or url.hostname or LOOPBACK,
            token_file=Path(serving.repository_token_file) if serving.repository_token_file else None,
            niceness=serving.niceness,
            report=report,
        )
        server.host_key = "serving.bind_host" if serving.bind_host else "serving.inference_url"
        return server

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def inference_url(self) -> str:
        """Where this machine asks it: loopback where it listens on every interface."""
        host = _EVERY_INTERFACE.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def publisher_settings(self) -> dict[str, str]:
        """The ``serving`` keys that point a daemon's publisher at this server, token included."""
        return {"inference_url": self.inference_url, "repository_token_file": str(self.token_file)}

    def choose_ports(self) -> None:
        self.ports = [free_port()]

    def command(self) -> list[str]:
        # No `nice`: the server lowers its own priority once it serves (serving/runtimes/kserve.py).
        return [
            sys.executable, "-m", "serving.runtimes.kserve_server",
            "--model-store", str(self.store_root),
            "--model-name", self.model,
            "--host", self.host,
            "--http-port", str(self.port),
            "--device", self.device,
            "--niceness", str(self.niceness),
            "--repository-token-file", str(self.token_file),
        ]  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it answers ``/v2/health/live``; refused while one runs from
        this folder, and with one line naming the key and the fix for a token file that cannot be read
        or an address that cannot be listened on."""
        require_kserve()
        self.refuse_second_start("KServe's model server", "alma serve --kind kserve --stop")
        self.prepare_token()
        if self.port_given:  # a port chosen here moves when taken (ServerProcess.start)
            check_address(self.host, self.port, self.host_key)
        priority = f"normal priority, niceness {self.niceness} once it serves" if self.niceness else "niceness 0"
        self.report(f"starting KServe's model server on {self.host}:{self.port} ({priority}; its log: {self.log_path})")
        super().start()

    def prepare_token(self) -> None:
        """Write this server's token where no file is named and none is written yet; the file must be
        readable either way."""
        if not self.token_named:
            write_token(self.token_file)
        read_token(self.token_file, named=self.token_named)

    def wait_ready(self, deadline: float) -> None:
        began = next_report = time.monotonic()
        live = f"{self.inference_url}/v2/health/live"

        def answers() -> bool:
            nonlocal next_report
            now = time.monotonic()
            if now - next_report >= REPORT_SECONDS:
                self.report(
                    f"waiting for KServe's model server to answer {live}: {now - began:.0f} s so far "
                    f"(as long as it keeps using CPU, up to {self.start_timeout:.0f} s)"
                )
                next_report += REPORT_SECONDS
            return http_ok(live)

        self.wait_until(answers, "answering /v2/health/live", deadline)
        # And the socket that answers is its own, not another process's that took the port first.
        self.wait_until(lambda: self.listens_on(self.port), f"listening on port {self.port}", deadline)


def check_address(host: str, port: int, host_key: str) -> None:
    """Raise :class:`ConfigError`, one line naming the key and the fix, where ``host:port`` cannot be
    listened on now; bound as the server binds it (``SO_REUSEADDR``, as uvicorn sets it), then let go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as err:
            raise ConfigError(
                f"{host_key}: {host!r} is not an address of this machine ({err.strerror}): {_HOST_FIX}"
            ) from None
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"serving.inference_url: port {port} of {host} is taken by another process: stop it, or "
                    f"choose a free port in serving.inference_url"
                ) from None
            if err.errno == errno.EACCES:
                raise ConfigError(
                    f"serving.inference_url: port {port} needs privileges this user lacks: choose a port "
                    f"above 1023 in serving.inference_url"
                ) from None
            raise ConfigError(f"{host_key}: cannot listen on {host}:{port} ({err.strerror}): {_HOST_FIX}") from None


def require_kserve() -> None:
    """Fail with what to install when KServe's model server is missing."""
    if importlib.util.find_spec("kserve") is None:
        raise ServerNotInstalled(
            "--kind kserve (serving.kind): KServe's model server is not installed here: "
            "pip install 'alma-daemon[kserve]' (kserve==0.21.0), or start TorchServe with --kind torchserve"
        )
