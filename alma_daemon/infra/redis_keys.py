"""The Redis keyspace of one stream: every key's name is built here.

Every key of a stream carries the hash tag ``{<stream>}``, so Redis Cluster keeps a stream in one slot and a
MULTI/EXEC may touch any of them. What each key holds and who writes it is tabled once, in
docs/architecture.md, "Redis keys".
"""

from __future__ import annotations

from alma_daemon.data.wire_format import STREAM_NAME_RE

#: The Redis database's own identity, one for all the streams it holds (no hash tag: it belongs to no
#: stream): made by the first daemon that starts on it, and recorded in each model store's
#: stream-identity.json, so that a model store of another Redis is told from a Redis that lost its data.
REDIS_ID = "alma:redis-id"


class StreamKeys:
    """Names of the Redis keys of stream ``stream``."""

    def __init__(self, stream: str):
        if not STREAM_NAME_RE.fullmatch(stream):
            raise ValueError(f"stream name must match {STREAM_NAME_RE.pattern}; got {stream!r}")
        self.stream = stream
        self.prefix = f"alma:{{{stream}}}"

    def part(self, chunk: int, index: int) -> str:
        return f"{self.prefix}:part:{chunk}:{index}"

    def chunk(self, chunk: int) -> str:
        return f"{self.prefix}:chunk:{chunk}"

    @property
    def assembling(self) -> str:
        return f"{self.prefix}:assembling"

    @property
    def completed(self) -> str:
        return f"{self.prefix}:completed"

    @property
    def ready(self) -> str:
        return f"{self.prefix}:ready"

    @property
    def offsets(self) -> str:
        return f"{self.prefix}:offsets"

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    @property
    def ingest(self) -> str:
        return f"{self.prefix}:ingest"

    @property
    def pending(self) -> str:
        return f"{self.prefix}:pending"

    @property
    def kept(self) -> str:
        return f"{self.prefix}:kept"

    @property
    def buffered(self) -> str:
        return f"{self.prefix}:buffered"

    @property
    def engine(self) -> str:
        return f"{self.prefix}:engine"

    @property
    def series(self) -> str:
        return f"{self.prefix}:series"

    @property
    def policy(self) -> str:
        return f"{self.prefix}:policy"

    @property
    def daemon(self) -> str:
        return f"{self.prefix}:daemon"

    @property
    def identity(self) -> str:
        return f"{self.prefix}:identity"
