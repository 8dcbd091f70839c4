"""Masking: the password of a URL written in a config (``redis://user:password@host``, kept because
redis-py reads it) is replaced by ``***`` wherever the resolved config is saved or printed. Secrets
themselves come from files (alma_daemon/infra/credentials.py) and are never held in the config.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# scheme://user:password@rest, where the password runs to the last "@": a password with an unescaped
# "@" (which redis-py would misread anyway) is masked whole rather than leaked in part.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/]*:).*@(?P<rest>[^@]*)", re.S)


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
