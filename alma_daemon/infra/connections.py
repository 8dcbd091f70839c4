"""Clients for the configured Redis and Kafka, each built in one place.

:func:`redis_client` turns ``redis.*`` into a redis-py client (the buffer, the engine state, the
Redis-stream transport, ``alma status``); :func:`kafka_security` turns ``kafka.*`` into the
kafka-python keywords that the consumer (ingest), the producer and the admin client (replay) share;
:func:`kafka_client` builds any of the three with them. Passwords are read from their files here, at
connection time (alma_daemon/infra/credentials.py), so they live in the client objects only.

A server that refuses the login or the TLS handshake fails here, at start-up, with one line naming
the server and the keys to check (a :class:`ConfigError`, which the CLI prints without a traceback).
A Redis that cannot be reached fails here too, with one line naming it, ``redis.url`` and the fix
(:class:`~alma_daemon.infra.unreachable.ServerUnreachable`). A Kafka broker that accepts no
connection is found out here, at once (:func:`kafka_client`), as an outage the caller rides out or
reports (:func:`~alma_daemon.infra.unreachable.unreachable_line`).
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis

from alma_daemon.config import ConfigError, KafkaConfig, RedisConfig
from alma_daemon.infra.credentials import read_secret
from alma_daemon.infra.outages import redis_retry
from alma_daemon.infra.unreachable import ServerUnreachable

log = logging.getLogger(__name__)

ClientT = TypeVar("ClientT")

#: redis.* keys that go to redis-py unchanged (TLS files, for rediss:// URLs).
REDIS_TLS_KEYS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: kafka.* keys that go to kafka-python unchanged (TLS files, for SSL and SASL_SSL).
KAFKA_TLS_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
#: How long the TCP probe that precedes building a Kafka client waits for each bootstrap server.
PROBE_TIMEOUT_SECONDS = 2.0


def redis_server(url: str) -> str:
    """Where ``url`` points (host:port, or the socket path), for messages: never its credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def redis_client(config: RedisConfig) -> redis.Redis:
    """A client for ``config.url`` with the ACL user, the password from ``password_file`` and the TLS
    files; the connection and the login are checked once, so a wrong address or wrong credentials
    fail here rather than mid-run."""
    if not config.url:
        raise ValueError("redis_client needs redis.url (the embedded server: alma_daemon/service/embedded_redis.py)")
    options: dict[str, Any] = {"socket_timeout": 30, "socket_connect_timeout": 10, "retry": redis_retry()}
    if config.username:
        options["username"] = config.username
    if config.password_file:
        options["password"] = read_secret(config.password_file, "redis.password_file")
    options.update({key: getattr(config, key) for key in REDIS_TLS_KEYS if getattr(config, key)})
    client = redis.Redis.from_url(config.url, **options)
    try:
        _check_login(client, config.url, config.username)
    except (ConfigError, ServerUnreachable):
        client.close()
        raise
    return client


def _check_login(client: redis.Redis, url: str, username: str | None) -> None:
    server = redis_server(url)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise ConfigError(
            f"Redis at {server} refused the login ({exc}); check redis.username and redis.password_file"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        reason = _tls_failure(exc)
        if reason is None:
            raise ServerUnreachable("redis", server, exc) from exc
        raise ConfigError(
            f"Redis at {server}: TLS handshake failed ({reason}); check redis.url (rediss://), "
            f"redis.ssl_ca_certs, redis.ssl_certfile and redis.ssl_keyfile"
        ) from None
    log.info(
        "redis connected",
        extra={"server": server, "user": username or "default", "tls": urlsplit(url).scheme == "rediss"},
    )


def _tls_failure(exc: BaseException) -> str | None:
    """Why the TLS handshake behind a redis-py error failed, or None when the error is not about TLS.

    redis-py raises its own ConnectionError with the ``ssl`` error as its context: a server certificate
    the CA file does not vouch for, or a client certificate the server requires and did not get."""
    inner = exc.__cause__ or exc.__context__
    if isinstance(inner, ssl.SSLError):
        return re.sub(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$", "", str(inner)) or repr(inner)
    return None


def kafka_security(config: KafkaConfig) -> dict[str, Any]:
    """kafka-python keywords for ``kafka.security_protocol`` and its SASL and TLS keys (the SASL
    password read from ``kafka.sasl_password_file``); empty for PLAINTEXT."""
    if config.security_protocol == "PLAINTEXT":
        return {}
    settings: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.security_protocol.startswith("SASL_"):
        assert config.sasl_password_file is not None  # KafkaConfig requires it for the SASL protocols
        settings.update(
            sasl_mechanism=config.sasl_mechanism,
            sasl_plain_username=config.sasl_username,
            sasl_plain_password=read_secret(config.sasl_password_file, "kafka.sasl_password_file"),
        )
    settings.update({key: getattr(config, key) for key in KAFKA_TLS_KEYS if getattr(config, key)})
    return settings


def kafka_client(
    client_class: Callable[..., ClientT],
    bootstrap_servers: str,
    security: Mapping[str, Any],
    *,
    probe: bool = True,
    **options: Any,
) -> ClientT:
    """``client_class`` (KafkaConsumer, KafkaProducer or KafkaAdminClient) on ``bootstrap_servers``
    with ``security`` (:func:`kafka_security`); a refused SASL login fails with one line.

    A kafka-python client that fails to bootstrap (no broker answers) waits out its bootstrap
    timeout (``bootstrap_timeout_ms``, 30 s by default) and leaks its I/O thread. So a broker that
    is down is first found out with a plain TCP connection (:func:`broker_accepts_connections`),
    which fails at once; only a broker that accepts connections but never answers still costs the
    wait and a thread. ``probe=False`` skips that check, for a consumer or producer given
    ``api_version``, which does not bootstrap.
    """
    from kafka.errors import SaslAuthenticationFailedError

    if probe:
        broker_accepts_connections(bootstrap_servers)
    try:
        return client_class(bootstrap_servers=bootstrap_servers, **security, **options)
    except SaslAuthenticationFailedError as exc:
        raise ConfigError(
            f"Kafka at {bootstrap_servers} refused the SASL login ({exc}); check "
            f"kafka.sasl_mechanism, kafka.sasl_username and kafka.sasl_password_file"
        ) from None


def broker_accepts_connections(bootstrap_servers: str) -> None:
    """Return once one of ``bootstrap_servers`` accepts a TCP connection; raise
    :class:`~kafka.errors.KafkaConnectionError` (an outage) naming them when none does."""
    from kafka.cluster import collect_hosts
    from kafka.errors import KafkaConnectionError

    errors: list[str] = []
    last: OSError | None = None
    for host, port, _family in collect_hosts(bootstrap_servers, randomize=False):
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_SECONDS).close()
            return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc}")
            last = exc
    # Chained to the operating system's reason, which the one-line messages show (infra/unreachable.py).
    raise KafkaConnectionError(f"no Kafka broker accepts connections ({'; '.join(errors)})") from last
