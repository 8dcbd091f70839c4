"""Structured, quiet-by-default logging: ``key=value`` lines (or JSON lines) on stderr.

By default only warnings and :data:`NOTICE` lines show: a notice is progress a person waits on (a
server starting, the last swap of a run), never a problem. ``-v`` adds info lines, ``-vv`` debug.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

#: Between INFO and WARNING: shown by default, for progress on a wait of more than a few seconds.
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")


class ExplainedError(RuntimeError):
    """An error whose message is a whole sentence for a user (what failed, where, the fix): shown on
    one line without its class name (:func:`error_text`)."""


class KeyValueFormatter(logging.Formatter):
    """``time level logger message key=value ...`` with the record's ``extra`` fields."""

    def __init__(self, as_json: bool = False):
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        # A record logged with exc_info (log.exception, -vv's traceback) carries its stack.
        traceback = self.formatException(record.exc_info) if record.exc_info else None
        if self.as_json:
            return json.dumps(
                {
                    "time": record.created,
                    "level": record.levelname,
                    "logger": record.name,
                    "message": record.getMessage(),
                    **fields,
                    **({"traceback": traceback} if traceback else {}),
                },
                default=str,
            )
        extra = " ".join(f"{k}={v}" for k, v in flat_fields(fields))
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname.lower()} {record.name}: {record.getMessage()}"
        line = f"{line} {extra}".rstrip()
        return f"{line}\n{traceback}" if traceback else line


def flat_fields(fields: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``key=value`` pairs with scalar values, for a human-readable line: a mapping becomes one
    field per entry (``outage.server=kafka``), a list its items joined by commas, a list of mappings
    the first field of each (their name, as records put it first: ``outages=kafka,redis``); text on
    one line. JSON lines keep the structure."""
    pairs: list[tuple[str, str]] = []
    for key, value in fields.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            pairs.extend(flat_fields(value, f"{name}.") if value else [(name, "none")])
        elif isinstance(value, list | tuple | set | frozenset):
            items = [_first_field(item) for item in value]
            pairs.append((name, ",".join(items) if items else "none"))
        else:
            pairs.append((name, _scalar(value)))
    return pairs


def _first_field(item: Any) -> str:
    if isinstance(item, Mapping):
        return _first_field(next(iter(item.values()))) if item else "none"
    if isinstance(item, list | tuple | set | frozenset):
        return f"{len(item)} items"
    return _scalar(item)


def _scalar(value: Any) -> str:
    return " ".join(str(value).split()) if isinstance(value, str) else str(value)


def configure_logging(verbosity: int = 0, as_json: bool = False) -> None:
    """Warnings and notices by default; ``-v`` for info, ``-vv`` for debug. Libraries log their
    warnings only: kafka-python's only with ``-v``, as it logs every failed connection attempt at
    ERROR (once per reconnect, for as long as a broker is down) and our own code reports an outage once."""
    level = NOTICE if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("apscheduler", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    logging.getLogger("kafka").setLevel(logging.CRITICAL if verbosity <= 0 else max(level, logging.WARNING))


def error_text(exc: BaseException) -> str:
    """``Class: message``, for one-line errors; kafka-python's messages already start with their class
    name, and an :class:`ExplainedError` is its message alone."""
    if isinstance(exc, ExplainedError):
        return str(exc)
    message = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    name = type(exc).__name__
    if not message or message == name or message.startswith(f"{name}: "):
        return message or name
    return f"{name}: {message}"


def print_error(line: str) -> None:
    """Print ``line`` on stderr on a line of its own, never after a progress bar on the bar's line
    (tqdm moves an open bar below it)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()
