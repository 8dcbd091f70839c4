"""The Redis helpers that ingest and the step commit share: a watched transaction, a dead letter, a hash read.

Both write the stream's keys in MULTI/EXEC transactions (``service/ingest/store.py`` a batch of
records, ``service/step_commit.py`` a step) and both dead-letter what they cannot use, so the helpers
live here, below both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alma_daemon.infra.redis_keys import StreamKeys

#: The dead-letter stream keeps about this many entries (XADD MAXLEN ~), so bad input cannot fill Redis.
DEAD_LETTER_MAXLEN = 10_000
#: A rejected record's key, value and headers are kept whole, to be fixed and sent again, when together
#: they are at most this long: the stream then holds at most about 10 000 x 64 KiB (625 MiB), and a
#: typical JSON event (under 1 KiB) costs far less. A longer record (a chunk part) keeps its sizes only.
DEAD_LETTER_RECORD_BYTES = 64 * 1024


@contextmanager
def watched_transaction(client: Any, key: str) -> Iterator[Any]:
    """A MULTI/EXEC pipeline that WATCHes ``key``, which only its caller writes; reset on exit.

    redis-py retries a failed command on a new connection, a transaction included: one cut after
    Redis ran it would then run twice, and HINCRBY, RPUSH and XADD are not idempotent. redis-py
    never retries a watched transaction; the caller rereads Redis instead (docs/service.md, "Outages").
    The reset hands the connection back to the pool, UNWATCHed, also when the caller gives up before
    ``execute()``.
    """
    pipe = client.pipeline(transaction=True)
    try:
        pipe.watch(key)
        pipe.multi()
        yield pipe
    finally:
        pipe.reset()


def dead_letter(
    pipe: Any,
    keys: StreamKeys,
    reason: str,
    detail: str,
    origin: str,
    *,
    key: bytes | None = None,
    value: bytes | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    """Add to ``pipe``: an entry in the dead-letter stream ``alma:{s}:dead`` and its counters.

    A record of at most :data:`DEAD_LETTER_RECORD_BYTES` keeps its ``key``, ``value`` and ``headers``
    whole, laid out as an entry of the embedded transport's stream (headers as a JSON list of
    ``[name, value]``, values read as latin-1), so it can be fixed and sent again; a longer one keeps
    the first 200 bytes of its key and the value's size (``value_bytes``), without a ``value`` field.
    """
    entry: dict[str, str | bytes | int] = {
        "reason": reason,
        "detail": detail[:2000],
        "origin": origin,
        "at": f"{time.time():.3f}",
        "value_bytes": len(value or b""),
    }
    header_text = _headers_text(headers)
    if len(key or b"") + len(value or b"") + len(header_text or b"") <= DEAD_LETTER_RECORD_BYTES:
        entry["key"] = key or b""
        if value is not None:
            entry["value"] = value
        if header_text is not None:
            entry["headers"] = header_text
    else:
        entry["key"] = (key or b"")[:200]
    pipe.xadd(keys.dead, entry, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
    pipe.hincrby(keys.ingest, "records_rejected", 1)
    pipe.hincrby(keys.ingest, f"rejected:{reason}", 1)


def _headers_text(headers: object) -> bytes | None:
    """Headers as the embedded transport writes them; None where there are none, or they are not
    (str, bytes | None) pairs (the record was rejected for them; its ``detail`` says how)."""
    if not isinstance(headers, list):
        return None
    pairs = []
    for item in headers:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            return None
        name, raw = item
        if raw is not None and not isinstance(raw, (bytes, bytearray, memoryview)):
            return None
        pairs.append([name, None if raw is None else bytes(raw).decode("latin-1")])
    return json.dumps(pairs).encode()


def text_hash(client: Any, key: str) -> dict[str, str]:
    """The hash at ``key``, its field names and values decoded."""
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
