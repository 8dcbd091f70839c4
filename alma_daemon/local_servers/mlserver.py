"""Seldon's MLServer as a local server over a model store: the other Open Inference Protocol server the
publisher of ``serving.kind: kserve`` is tested against (tests/test_serving_mlserver.py).

MLServer 1.7 pins FastAPI and Starlette versions that KServe's cannot share, so it runs from a
virtualenv of its own (scripts/setup_mlserver.sh makes it; :data:`PYTHON_ENV` names its interpreter)
with alma-daemon installed in it, and loads :mod:`serving.runtimes.mlserver` from this checkout.
``mlserver start <folder>`` reads the settings.json that :class:`MLServerServer` writes in its
folder, beside its log and pid file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import serving
from alma_daemon.local_servers.processes import LOOPBACK, RecordedServer, free_ports, http_ok

PID_FILE = "mlserver.pid"
SETTINGS_FILE = "settings.json"
#: The interpreter of MLServer's virtualenv; its ``mlserver`` command lies beside it.
PYTHON_ENV = "ALMA_MLSERVER_PYTHON"
#: ``.venvs/mlserver`` in the checkout, where scripts/setup_mlserver.sh makes it.
DEFAULT_PYTHON = Path(serving.__file__).resolve().parent.parent / ".venvs" / "mlserver" / "bin" / "python"
#: Importing torch and MLServer takes a few seconds; tens at niceness 19 on a busy host.
START_TIMEOUT_SECONDS = 120.0


def _silent(line: str) -> None:
    pass


def mlserver_python() -> Path:
    """The interpreter of MLServer's virtualenv: ``$ALMA_MLSERVER_PYTHON``, else :data:`DEFAULT_PYTHON`."""
    return Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON)


class MLServerServer(RecordedServer):
    """MLServer over one model of a model store, its REST port on the loopback interface.

    Its gRPC port, which MLServer always opens, is a second free port; its metrics server is off.
    Inference runs in the server's main process (``parallel_workers: 0``), where the model
    repository and the runtimes share what is loaded (serving/runtimes/mlserver.py). Its model
    repository API (REST and gRPC) cannot be closed with a token as KServe's is (MLServer has no
    authentication, and what alma plugs into never sees a request: docs/serving.md), so both ports
    are on loopback only.
    """

    name = "mlserver"
    pid_file = PID_FILE
    start_timeout = START_TIMEOUT_SECONDS

    def __init__(
        self,
        folder: Path,
        store_root: Path,
        model: str = "alma",
        *,
        niceness: int = 0,
        device: str = "auto",
        python: Path | None = None,
        report: Callable[[str], None] = _silent,
    ) -> None:
        super().__init__(folder, free_ports(2), choose_ports=True, niceness=niceness)
        self.store_root = Path(store_root).resolve()
        self.model = model
        self.device = device
        self.python = python or mlserver_python()
        self.report = report
        self.write_settings()

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def inference_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def publisher_settings(self) -> dict[str, str]:
        """The ``serving`` keys that point a daemon's publisher at this server: no token (module docstring)."""
        return {"inference_url": self.inference_url}

    def choose_ports(self) -> None:
        self.ports = free_ports(2)
        self.write_settings()

    def write_settings(self) -> None:
        """The server's settings.json: ports, the checkpoint repository over the store, no workers."""
        settings = {
            "debug": False,  # True logs every request
            "host": LOOPBACK,
            "http_port": self.ports[0],
            "grpc_port": self.ports[1],
            "metrics_endpoint": None,
            "parallel_workers": 0,
            "model_repository_implementation": "serving.runtimes.mlserver.CheckpointRepository",
            "model_repository_implementation_args": {
                "store_root": str(self.store_root),
                "model": self.model,
                "device": self.device,
            },
        }
        (self.workdir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")

    def command(self) -> list[str]:
        return self.niced([str(self.python.parent / "mlserver"), "start", str(self.workdir)])

    def environment(self) -> dict[str, str]:
        # The runtime comes from this checkout whatever the virtualenv's alma-daemon points at.
        checkout = str(Path(serving.__file__).resolve().parent.parent)
        env = super().environment()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, env.get("PYTHONPATH")]))
        return env

    def start(self) -> None:
        """Start the server and wait until it is ready; refused while one runs from this folder."""
        require_mlserver(self.python)
        self.refuse_second_start("MLServer", f"kill the process group in {self.pid_path}")
        self.report(f"starting MLServer (niceness {self.niceness}; its log: {self.log_path})")
        super().start()

    def wait_ready(self, deadline: float) -> None:
        # Ready, not live: MLServer answers while it still loads what it serves at its start (a
        # restarted server's default version), and is ready once every model it holds is.
        self.wait_until(lambda: http_ok(f"{self.inference_url}/v2/health/ready"), "ready (/v2/health/ready)", deadline)
        super().wait_ready(deadline)  # and the ports that answer are its own


def require_mlserver(python: Path) -> None:
    """Fail with what to run when MLServer's virtualenv is missing."""
    if not (python.parent / "mlserver").is_file():
        raise RuntimeError(
            f"MLServer is not installed beside {python}: run scripts/setup_mlserver.sh "
            f"(or set {PYTHON_ENV} to the interpreter of a virtualenv with mlserver==1.7.1 and alma-daemon)"
        )
