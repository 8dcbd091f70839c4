"""Secrets: read from files at connection time, never held in the config, masked wherever it is shown.

One convention: a secret is the content of a file named by a ``*_file`` key
(``redis.password_file``, ``kafka.sasl_password_file``), which is where Kubernetes and docker compose
mount secrets. The config, and everything made from it (``results.json``, logs, ``alma status``), holds
the path only; :mod:`alma_daemon.service.connections` reads the value and hands it to the client.

The one place a value can still be written into a config is a URL's password
(``redis://user:password@host``, kept because redis-py reads it). :func:`mask_secrets` replaces every
such password with ``***`` in the resolved config before it is saved or printed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from alma_daemon.config import ConfigError

MASK = "***"

# scheme://user:password@rest, where the password runs to the last "@": a password with an unescaped
# "@" (which redis-py would misread anyway) is masked whole rather than leaked in part.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/]*:).*@(?P<rest>[^@]*)", re.S)


def read_secret(path: str, key: str) -> str:
    """The secret held in file ``path`` (named by config key ``key``), without its final newline."""
    try:
        value = Path(path).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not value:
        raise ConfigError(f"{key}: {path} is empty")
    return value


def mask_url(text: str) -> str:
    """``text`` with the password of a URL in it replaced by ``***`` (unchanged when it has none)."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['head']}{MASK}@{m['rest']}", text)


def mask_secrets(data: Any) -> Any:
    """A copy of plain config data (mappings, lists, scalars) with every URL's password masked."""
    if isinstance(data, dict):
        return {key: mask_secrets(value) for key, value in data.items()}
    if isinstance(data, list):
        return [mask_secrets(value) for value in data]
    if isinstance(data, str):
        return mask_url(data)
    return data
