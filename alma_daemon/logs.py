"""Structured, quiet-by-default logging: ``key=value`` lines (or JSON lines) on stderr."""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


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
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname.lower()} {record.name}: {record.getMessage()}"
        line = f"{line} {extra}".rstrip()
        return f"{line}\n{traceback}" if traceback else line


def configure_logging(verbosity: int = 0, as_json: bool = False) -> None:
    """Warnings only by default; ``-v`` for info, ``-vv`` for debug. Libraries log their warnings
    only: kafka-python's only with ``-v``, as it logs every failed connection attempt at ERROR
    (once per reconnect, for as long as a broker is down) and our own code reports an outage once."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("apscheduler", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    logging.getLogger("kafka").setLevel(logging.CRITICAL if verbosity <= 0 else max(level, logging.WARNING))


def error_text(exc: BaseException) -> str:
    """``Class: message``, for one-line errors; kafka-python's messages already start with their class name."""
    message = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    name = type(exc).__name__
    if not message or message == name or message.startswith(f"{name}: "):
        return message or name
    return f"{name}: {message}"
