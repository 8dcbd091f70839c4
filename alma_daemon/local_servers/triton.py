"""Triton Inference Server as a local server: the one ``alma serve --kind triton`` runs, and the one
tests/test_serving_triton.py and benchmarks/bench_swap.py start.

tritonserver comes from nvidia-pytriton's wheel (the ``triton`` extra), in a virtualenv of its own
(scripts/setup_triton.sh; :data:`PYTHON_ENV` names its interpreter): the wheel's numpy pin is not the
package's. That virtualenv's Python is also the one Triton's Python backend runs each checkpoint in
(serving/runtimes/triton/): the backend's stub process embeds the interpreter's shared library, found
through ``LD_LIBRARY_PATH``, and takes the virtualenv for its own by finding its ``python3`` first on
``PATH``; it ignores ``PYTHONPATH``, so this checkout is named in :data:`PATH_ENV` instead. The
server's folder holds its log, pid file, token and a copy of the Python backend with the stub built
for that Python (as PyTriton itself lays it out).

It serves the model repository in the model store (serving/runtimes/triton/repository.py; the publisher writes
it), in explicit model control: a name loads when the publisher asks. A restarted server loads at its
start the default name and its versioned name, where their folders and the default file say so. It
listens on one address (``serving.bind_host``, else the host of ``serving.inference_url``), HTTP only
(no gRPC, no metrics port); the APIs that change the server answer only the token
(serving/protocols/triton_token.py). It starts at normal priority; each version's Python-backend process takes
``serving.niceness`` once its checkpoint is loaded (and the session's autogroup with it, which later
loads run in: alma_daemon/infra/priority.py), so a busy machine slows the start and the first load
without stalling them.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from alma_daemon.config import Config
from alma_daemon.core.checkpoint_index import CheckpointIndex
from alma_daemon.infra.priority import NICENESS_ENV
from alma_daemon.local_servers.kserve import check_address
from alma_daemon.local_servers.processes import (
    LOOPBACK,
    RecordedServer,
    free_port,
    group_members,
    http_ok,
)
from alma_daemon.local_servers.triton_install import CHECKOUT, TritonInstall, triton_python
from serving.protocols.repository_token import TOKEN_FILE, read_token, write_token
from serving.protocols.triton_token import triton_folder
from serving.protocols.version_names import read_default, versioned_name
from serving.runtimes.triton.repository import PATH_ENV, TritonRepository, repository_root

PID_FILE = "triton.pid"
#: The longest wait for a start that keeps using CPU (models loaded at the start import torch).
START_TIMEOUT_SECONDS = 600.0
#: A start that used no CPU for this long is stuck.
STALL_SECONDS = 60.0
REPORT_SECONDS = 10.0
#: The APIs only the token opens: the model repository, and those that change the server's logging,
#: tracing (which writes files where it is told) and shared memory.
RESTRICTED_APIS = "model-repository,logging,trace,shared-memory"
_EVERY_INTERFACE = {"0.0.0.0": LOOPBACK, "": LOOPBACK, "::": "::1"}


def _silent(line: str) -> None:
    pass


class TritonServer(RecordedServer):
    """Triton over the model repository of one model store (module docstring).

    Given a port (:meth:`for_config`: ``alma serve --kind triton``), it listens there and can be found
    and stopped by another process through its pid file; without one (the tests, the benchmarks) it
    takes a free loopback port, chosen again when another process takes it first. Its token is
    ``token_file`` where given (a file someone provides, which must exist), else
    ``<folder>/repository_token``, written at its first start. ``model`` is the name whose recorded
    default it loads at its start; the publisher may load any other model of the store.
    """

    name = "triton"
    pid_file = PID_FILE
    start_timeout = START_TIMEOUT_SECONDS
    stall_timeout = STALL_SECONDS
    #: Each version's backend process lowers its own priority once loaded (``NICENESS_ENV``), not ``nice``.
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
        python: Path | None = None,
        report: Callable[[str], None] = _silent,
    ) -> None:
        super().__init__(folder, [port or free_port()], choose_ports=port is None, niceness=niceness)
        self.store_root = Path(store_root).resolve()
        self.repository = repository_root(self.store_root)
        self.model = model
        self.host = host
        #: The config key messages name for the address: set by :meth:`for_config`.
        self.host_key = "serving.bind_host"
        self.port_given = port is not None
        self.token_named = token_file is not None
        self.token_file = Path(token_file) if token_file is not None else self.workdir / TOKEN_FILE
        self.python = python or triton_python()
        self.report = report
        self._install: TritonInstall | None = None

    @classmethod
    def for_config(cls, config: Config, report: Callable[[str], None] = _silent) -> TritonServer:
        """The server of ``alma serve --kind triton``: in ``<daemon.state_dir>/triton``, where ``serving`` says."""
        serving = config.serving
        url = urllib.parse.urlsplit(serving.inference_url)
        server = cls(
            triton_folder(config),
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
        return {"kind": "triton", "inference_url": self.inference_url, "repository_token_file": str(self.token_file)}

    def choose_ports(self) -> None:
        self.ports = [free_port()]

    @property
    def install(self) -> TritonInstall:
        if self._install is None:
            self._install = TritonInstall.find(self.python)
        return self._install

    def startup_models(self) -> list[str]:
        """The names loaded at the start: the recorded default, under both its names, where the
        repository's ensemble serves the version the default file names (a publisher that stopped
        between the two leaves the switch to the daemon) and its checkpoint is still on disk."""
        repository = TritonRepository(CheckpointIndex(self.store_root, self.model))
        try:
            version = read_default(self.store_root / self.model)
        except ValueError as err:
            self.report(f"the default version cannot be read; serving none until the daemon sets one: {err}")
            return []
        if version is None or repository.default_version() != version:
            return []
        names = [versioned_name(self.model, version), self.model]
        if not (self.store_root / self.model / str(version)).is_dir() or not all(map(repository.has, names)):
            return []
        return names

    def command(self) -> list[str]:
        arguments = [
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self.startup_models()),
            f"--backend-directory={self.workdir / 'backends'}",
            f"--http-address={self.host}",
            f"--http-port={self.port}",
            # The configs are complete (serving/runtimes/triton/repository.py): completing one would run the
            # model's Python, torch's import included, once more per load.
            "--disable-auto-complete-config",
            "--allow-grpc=false",
            "--allow-metrics=false",
            # A version at the start that fails to load leaves the server up, serving none until the
            # daemon loads one; the load's error is in the log.
            "--exit-on-error=false",
            "--exit-timeout-secs=5",
        ]
        # The token reaches Triton on its command line (it reads it nowhere else), but not this
        # server's log, which writes the command line: the shell reads it from its file.
        restricted = f"--http-restricted-api={RESTRICTED_APIS}:Authorization=Bearer "
        script = f'exec "$0" "$@" "{restricted}$(cat "$ALMA_TRITON_TOKEN_FILE")"'
        return ["sh", "-c", script, str(self.install.server), *arguments]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        install = self.install
        libraries = [str(folder) for folder in install.libraries]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [*libraries, env.get("LD_LIBRARY_PATH")]))
        # The stub takes the first python3 on PATH as its interpreter: the virtualenv's.
        env["PATH"] = os.pathsep.join(filter(None, [str(install.python.parent), env.get("PATH")]))
        env[PATH_ENV] = str(CHECKOUT)
        # OpenMP's threads (torch's, in each backend process) spin while they wait for work by default:
        # on 2 busy cores an MLP's batch of 64 took 16 to 32 ms of CPU instead of under 1 ms, taken
        # from training and the other versions. Sleeping costs a few microseconds per forward pass.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env["ALMA_TRITON_TOKEN_FILE"] = str(self.token_file)
        if self.niceness:
            env[NICENESS_ENV] = str(self.niceness)  # each version's backend process, once loaded
        return env

    def start(self) -> None:
        """Start the server at normal priority and wait until it answers ``/v2/health/live``;
        refused while one runs from this folder, and with one line naming what to do where Triton is not
        installed, the token file cannot be read or the address cannot be listened on."""
        install = self.install
        self.refuse_second_start("Triton", "alma serve --kind triton --stop")
        self.prepare_token()
        if self.port_given:
            check_address(self.host, self.port, self.host_key)
        self.prepare_backend(install)
        self.repository.mkdir(parents=True, exist_ok=True)
        self.report(f"starting Triton on {self.host}:{self.port} (its log: {self.log_path})")
        super().start()

    def prepare_token(self) -> None:
        """Write this server's token where no file is named and none is written yet; it must be readable."""
        if not self.token_named:
            write_token(self.token_file)
        read_token(self.token_file, named=self.token_named)

    def prepare_backend(self, install: TritonInstall) -> None:
        """The Python backend in this server's folder, with the stub for the virtualenv's Python."""
        backend = self.workdir / "backends" / "python"
        backend.mkdir(parents=True, exist_ok=True)
        sources = [*(install.dist / "backends" / "python").glob("*.*"), install.stub]
        for source in (source for source in sources if source.is_file()):
            target = backend / source.name
            if target.is_file() and _same_file_times(source, target):
                continue
            # Beside it, then renamed over it: a stub of the last run may still be exiting, and a file
            # that runs cannot be written (ETXTBSY).
            partial = backend / f".{source.name}.partial"
            shutil.copy2(source, partial)
            os.replace(partial, target)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server this object started, or else the one its pid file records: Triton first, which
        stops its backend processes itself (they do not end on a signal of their own: stopping them
        first, as other servers' children are, waited out the whole timeout), then whatever is left."""
        leader = self.pid if self.pid is not None else self.recorded_pid()
        if leader is not None:
            reap = self._proc.poll if self._proc is not None else None
            try:
                os.kill(leader, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while group_members(leader) and time.monotonic() < deadline:
                if reap is not None:
                    reap()
                time.sleep(0.05)
        super().stop(timeout)

    def wait_ready(self, deadline: float) -> None:
        began = next_report = time.monotonic()
        live = f"{self.inference_url}/v2/health/live"

        def answers() -> bool:
            nonlocal next_report
            now = time.monotonic()
            if now - next_report >= REPORT_SECONDS:
                self.report(f"waiting for Triton to answer {live}: {now - began:.0f} s so far")
                next_report += REPORT_SECONDS
            return http_ok(live)

        # Triton loads the models of --load-model before it listens: live means they are loaded.
        self.wait_until(answers, "answering /v2/health/live", deadline)
        self.wait_until(lambda: self.listens_on(self.port), f"listening on port {self.port}", deadline)


def _same_file_times(source: Path, copy: Path) -> bool:
    """Whether ``copy`` is a copy of ``source`` made by ``shutil.copy2`` (same size and modification time)."""
    first, second = source.stat(), copy.stat()
    return first.st_size == second.st_size and first.st_mtime_ns == second.st_mtime_ns
