"""The Redis helpers that ingest and the step commit share: a watched transaction, a dead letter, a hash read.

Both write the stream's keys in MULTI/EXEC transactions (``service/ingest/store.py`` a batch of
records, ``service/step_commit.py`` a step) and both dead-letter what they cannot use, so the helpers
live here, below both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alma_daemon.infra.redis_keys import StreamKeys

#: The dead-letter stream keeps about this many entries (XADD MAXLEN ~), so bad input cannot fill Redis.
DEAD_LETTER_MAXLEN = 10_000


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
    value_bytes: int = 0,
) -> None:
    """Add to ``pipe``: an entry in the dead-letter stream ``alma:{s}:dead`` and its counters."""
    entry = {
        "reason": reason,
        "detail": detail[:2000],
        "origin": origin,
        "at": f"{time.time():.3f}",
        "key": (key or b"")[:200],
        "value_bytes": value_bytes,
    }
    pipe.xadd(keys.dead, entry, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
    pipe.hincrby(keys.ingest, "records_rejected", 1)
    pipe.hincrby(keys.ingest, f"rejected:{reason}", 1)


def text_hash(client: Any, key: str) -> dict[str, str]:
    """The hash at ``key``, its field names and values decoded."""
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
