"""Where records come from: a Kafka topic or, in embedded mode, a Redis stream.

A source yields :class:`SourceRecord` objects in order per position (a Kafka partition, or the one
Redis stream) and can be moved to stored offsets. Offsets live in Redis next to the data
(``alma:{s}:offsets``), never in the source, so one MULTI/EXEC stores both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SourceRecord:
    """One record as read from the transport, before any validation."""

    #: Which ordered log it came from ("0" for Kafka partition 0, "stream" for a Redis stream).
    position: str
    #: What to store as that position's offset once the record is handled (the next one to read).
    next_offset: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    #: Where it was read, for the dead-letter entry and logs (e.g. "alma.mnist/0@12").
    origin: str
    #: Set when the transport itself could not read the record's fields (it is then rejected).
    problem: str | None = None


class RecordSource(Protocol):
    """An ordered supply of records that can resume from offsets stored elsewhere."""

    #: The server behind the transport, as the outage board names it ("kafka" or "redis").
    server: str
    #: What the transport raises while its server cannot be reached (an outage, not a bug).
    unreachable: tuple[type[BaseException], ...]

    def seek(self, offsets: dict[str, str]) -> None:
        """Continue every position from its stored offset (positions absent: from the beginning)."""
        ...

    def poll(self, timeout: float, max_records: int) -> list[SourceRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout`` seconds for the first one."""
        ...

    def acknowledge(self, offsets: dict[str, str]) -> None:
        """Records up to ``offsets`` are stored in Redis; a transport may now drop them.

        Called on ingest's committer thread, while :meth:`poll` may run on the ingest thread: an
        implementation must be safe to call concurrently with it (a redis-py client is; a
        KafkaConsumer is not, and the Kafka source's acknowledge leaves it alone).
        """
        ...

    def lag(self) -> int | None:
        """Records published but not yet returned by :meth:`poll`, when the transport can tell."""
        ...

    def close(self) -> None: ...
