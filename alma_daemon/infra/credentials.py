"""Secrets: read from files at connection time, never held in the config, masked wherever it is shown.

One convention: a secret is the content of a file named by a ``*_file`` key
(``redis.password_file``, ``kafka.sasl_password_file``), which is where Kubernetes and docker compose
mount secrets. The config, and everything made from it (``results.json``, logs, ``alma status``), holds
the path only; :mod:`alma_daemon.infra.connections` reads the value and hands it to the client.

The one place a value can still be written into a config is a URL's password
(``redis://user:password@host``, kept because redis-py reads it): :mod:`alma_daemon.config.masking`
masks it in the resolved config before it is saved or printed.
"""

from __future__ import annotations

from pathlib import Path

from alma_daemon.config import ConfigError


def read_secret(path: str, key: str) -> str:
    """The secret held in file ``path`` (named by config key ``key``), without its final newline."""
    try:
        value = Path(path).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not value:
        raise ConfigError(f"{key}: {path} is empty")
    return value
