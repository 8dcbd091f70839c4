"""Pytest plugin: real Redis, Kafka (Tansu), Prometheus, TorchServe and KServe on free loopback ports.

Load it with ``pytest_plugins = ["tests.helpers.servers"]`` in ``tests/conftest.py`` or with
``-p tests.helpers.servers``.
Redis, the Kafka broker, Prometheus, TorchServe and KServe's model server are the package's own
(alma_daemon/local_servers/), the implementation ``alma dev up`` and ``alma serve`` start too; here
are the fixtures over them, and what only the tests use: a test CA, a TLS proxy in front of Tansu.
Every server runs as its own process group (``start_new_session=True``) with its output in a log
file in its temporary directory, listens on 127.0.0.1 only (KServe's binds every interface), and is
killed, whole group, at teardown whatever the test's outcome. See ``docs/test-servers.md``.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from alma_daemon.local_servers.kserve import KServeServer
from alma_daemon.local_servers.mlserver import PYTHON_ENV, MLServerServer, mlserver_python
from alma_daemon.local_servers.processes import (
    LOOPBACK,
    PortTakenError,
    ServerProcess,
    ServerStartError,
    free_port,
    free_ports,
    group_members,
    http_request,
    port_open,
)
from alma_daemon.local_servers.servers import KafkaBroker, PrometheusServer, RedisServer
from alma_daemon.local_servers.torchserve import TorchServeServer, java_available

__all__ = [
    "LOOPBACK",
    "KServeServer",
    "KafkaBroker",
    "MLServerServer",
    "PortTakenError",
    "PrometheusServer",
    "RedisServer",
    "ServerProcess",
    "ServerStartError",
    "TLSKafkaBroker",
    "TestCA",
    "TorchServeServer",
    "free_port",
    "free_ports",
    "group_members",
    "http_request",
    "java_available",
    "port_open",
]


#: The fixtures of this plugin that start a real server (``test_ca`` only runs ``openssl``).
SERVER_FIXTURES = frozenset(
    {
        "redis_server",
        "redis_db",
        "redis_secured",
        "redis_tls",
        "kafka_broker",
        "kafka_tls",
        "prometheus_server",
        "torchserve_server",
        "kserve_server",
        "mlserver_server",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: starts real servers (Redis, Kafka, Prometheus, TorchServe, KServe); slow"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses a server fixture (directly or through another fixture) must be marked
    ``integration``, so that ``-m "not integration"`` (the fast tier) leaves it out: it fails here,
    before its fixtures start anything. Tests that build a server class themselves are not seen."""
    used = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if used and item.get_closest_marker("integration") is None:
        pytest.fail(
            f"{item.nodeid} uses the server fixture(s) {', '.join(sorted(used))}: mark it "
            "@pytest.mark.integration (see docs/test-servers.md)",
            pytrace=False,
        )


# ----------------------------------------------------------------------------------------- TLS


class TestCA:
    """A certificate authority made with ``openssl`` for one test session, and what it signed.

    PEM files in ``folder``: ``ca`` (the CA certificate clients and servers trust), a server
    certificate for 127.0.0.1 and localhost (``server_cert``, ``server_key``) and a client
    certificate (``client_cert``, ``client_key``) for servers that require one. EC P-256 keys
    (quick to make), extensions as Python 3.13's strict verification wants them.
    """

    __test__ = False  # a helper, not a pytest test class

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = self.folder / "ca.pem", self.folder / "ca.key"
        self.server_cert, self.server_key = self.folder / "server.pem", self.folder / "server.key"
        self.client_cert, self.client_key = self.folder / "client.pem", self.folder / "client.key"
        self._openssl(
            "req",
            "-x509",
            *self._new_key(self.ca_key),
            "-out",
            self.ca,
            "-days",
            "2",
            "-subj",
            "/CN=alma test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        self._sign("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")
        self._sign("client", "alma-client", "extendedKeyUsage=clientAuth")

    @staticmethod
    def _new_key(path: Path) -> list[Any]:
        return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", path]

    def _sign(self, name: str, common_name: str, extensions: str) -> None:
        request, extfile = self.folder / f"{name}.csr", self.folder / f"{name}.ext"
        extfile.write_text(f"{extensions}\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
        self._openssl(
            "req", *self._new_key(self.folder / f"{name}.key"), "-out", request, "-subj", f"/CN={common_name}"
        )
        self._openssl(
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            self.ca,
            "-CAkey",
            self.ca_key,
            "-CAcreateserial",
            "-out",
            self.folder / f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            extfile,
        )

    def _openssl(self, *args: Any) -> None:
        if shutil.which("openssl") is None:
            raise FileNotFoundError("openssl missing (apt-get install -y openssl)")
        done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, cwd=self.folder)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


class TLSProxy(ServerProcess):
    """``tests/helpers/tls_proxy.py``: TLS on ``port``, relayed as plain TCP to ``target_port``; clients must
    show a certificate the test CA signed."""

    name = "tls-proxy"

    def __init__(self, workdir: Path, port: int, target_port: int, ca: TestCA) -> None:
        self.port, self.target_port, self.ca = port, target_port, ca
        super().__init__(workdir, [port])

    def command(self) -> list[str]:
        script = Path(__file__).with_name("tls_proxy.py")
        return [
            sys.executable,
            str(script),
            str(self.port),
            str(self.target_port),
            str(self.ca.server_cert),
            str(self.ca.server_key),
            str(self.ca.ca),
        ]


class TLSKafkaBroker:
    """Tansu behind a :class:`TLSProxy`: ``bootstrap_servers`` speaks TLS only and wants the test
    CA's client certificate; the broker advertises the proxy, so every connection goes through it.

    Tansu 0.6.0 serves neither TLS (its ``--cert`` and ``--key`` flags exclude each other) nor a
    usable SASL (no PLAIN; SCRAM users cannot be created once ``--authentication`` is on), hence the
    proxy, and no SASL broker at all. Create topics through the TLS port (``alma replay`` does):
    ``KafkaBroker.create_topic`` talks plaintext.
    """

    def __init__(self, workdir: Path, ca: TestCA) -> None:
        self.workdir, self.ca = Path(workdir), ca
        self._may_move = True
        self._build()

    def _build(self) -> None:
        tls_port, broker_port = free_ports(2)
        self.broker = KafkaBroker(self.workdir / "tansu", broker_port, advertised_port=tls_port)
        self.proxy = TLSProxy(self.workdir / "proxy", tls_port, broker_port, self.ca)

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.proxy.port}"

    def start(self) -> None:
        """Start both; the first time, on two fresh ports when another process took one (as
        :class:`ServerProcess` does: the broker advertises the proxy's port, so both are rebuilt)."""
        attempts = ServerProcess.port_attempts if self._may_move else 1
        for attempt in range(1, attempts + 1):
            try:
                self.broker.start()
                self.proxy.start()
            except PortTakenError:
                self.broker.kill()
                if attempt == attempts:
                    raise
                self._build()
            else:
                break
        self._may_move = False

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.stop()


@contextlib.contextmanager
def metrics_page(body: bytes, port: int = 0) -> Iterator[str]:
    """A stand-in for a daemon's exporter: ``body`` (Prometheus text format) at /metrics on
    127.0.0.1:``port`` (0: a free one), served from a thread; yields ``host:port``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_db(redis_server: RedisServer) -> Iterator[Any]:
    """A client on an empty Redis; restarts the session server if an earlier test left it down."""
    if not redis_server.running:
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    """A CA with a server certificate for 127.0.0.1 and a client certificate, made by ``openssl``."""
    return TestCA(tmp_path_factory.mktemp("ca"))


def _secret(name: str) -> str:
    # Distinctive and random: a test that greps outputs for it cannot match by chance.
    return f"{name}-{secrets.token_hex(8)}"


@pytest.fixture(scope="session")
def redis_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """Redis with ``requirepass`` (``.password``) and an ACL user ``alma`` (``.users["alma"]``)."""
    server = RedisServer(
        tmp_path_factory.mktemp("redis-secured"), password=_secret("requirepass"), users={"alma": _secret("acl")}
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_tls(tmp_path_factory: pytest.TempPathFactory, test_ca: TestCA) -> Iterator[RedisServer]:
    """Redis on TLS only (``rediss://``), client certificates required, with ``requirepass`` and an
    ACL user ``alma``; ``.tls`` is the :class:`TestCA`."""
    server = RedisServer(
        tmp_path_factory.mktemp("redis-tls"),
        password=_secret("requirepass"),
        users={"alma": _secret("acl")},
        tls=test_ca,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory: pytest.TempPathFactory, test_ca: TestCA) -> Iterator[TLSKafkaBroker]:
    """A Kafka protocol broker reachable by TLS only, client certificates required."""
    broker = TLSKafkaBroker(tmp_path_factory.mktemp("kafka-tls"), test_ca)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def prometheus_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[Sequence[str]], PrometheusServer]]:
    """Factory: ``prometheus_server(["127.0.0.1:PORT", ...])`` -> a started PrometheusServer."""
    started: list[PrometheusServer] = []

    def make(targets: Sequence[str]) -> PrometheusServer:
        server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), targets)
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def torchserve_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[], TorchServeServer]]:
    """Factory: ``torchserve_server()`` -> a started TorchServeServer on free ports. Skips the test
    if java is absent."""
    if not java_available():
        pytest.skip("TorchServe needs Java 17: no java on PATH or in $JAVA_HOME/bin")
    started: list[TorchServeServer] = []

    def make() -> TorchServeServer:
        server = TorchServeServer(tmp_path_factory.mktemp("torchserve"))
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def kserve_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., KServeServer]]:
    """Factory: ``kserve_server(store_root, model="alma")`` -> a started KServeServer over that model
    store on a free port. Skips the test if ``kserve`` is not installed."""
    if importlib.util.find_spec("kserve") is None:
        pytest.skip("KServe's model server is not installed: pip install 'alma-daemon[kserve]'")
    started: list[KServeServer] = []

    def make(store_root: Path, model: str = "alma") -> KServeServer:
        server = KServeServer(tmp_path_factory.mktemp("kserve"), store_root, model, device="cpu")
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def mlserver_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., MLServerServer]]:
    """Factory: ``mlserver_server(store_root, model="alma")`` -> a started MLServer over that model store,
    on the CPU. Skips the test where MLServer's virtualenv (scripts/setup_mlserver.sh) is missing: its
    pins conflict with KServe's, so it cannot share the package's environment."""
    if not mlserver_python().is_file():
        pytest.skip(
            f"MLServer's virtualenv is missing: no {mlserver_python()} (run scripts/setup_mlserver.sh, "
            f"or set {PYTHON_ENV} to its interpreter)"
        )
    started: list[MLServerServer] = []

    def make(store_root: Path, model: str = "alma") -> MLServerServer:
        server = MLServerServer(tmp_path_factory.mktemp("mlserver"), store_root, model, device="cpu")
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop()
