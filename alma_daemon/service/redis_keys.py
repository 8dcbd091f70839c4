"""The Redis keyspace of one stream (the table in docs/architecture.md).

Every key carries the hash tag ``{<stream>}``, so Redis Cluster keeps a stream in one slot and a
MULTI/EXEC may touch any of them. Keys beyond the design's table are marked "(service)": they hold
what the ingest assembler and the engine's buffer need to survive a restart.

::

    alma:{s}:part:<chunk>:<i>   bytes of one part (the record value, as received)
    alma:{s}:chunk:<chunk>      hash: parts, received, examples, bytes, first_offset, arrived_at,
                                dtype, got:<i> (one field per stored part)
    alma:{s}:assembling         (service) zset of chunks with some but not all parts stored
    alma:{s}:ready              zset of complete chunks not yet consumed by the engine
    alma:{s}:offsets            hash: source position (Kafka partition) -> next offset to read
    alma:{s}:dead               stream of rejected records with their reason
    alma:{s}:ingest             (service) hash of counters: chunks_received, examples_received,
                                records_rejected, rejected:<reason>, queued_bytes, last_completed;
                                refused_chunks (ids of chunks larger than redis.max_buffer_bytes)
    alma:{s}:split:<chunk>      (service) hash: train, val (safetensors), examples: a consumed chunk
    alma:{s}:pending            (service) zset of buffered chunks not yet trained on
    alma:{s}:kept               (service) zset of trained chunks kept for replay
    alma:{s}:engine             engine state: every EngineState field but the series, as JSON
    alma:{s}:series             (service) list of the engine's per-chunk records (JSON), oldest first
    alma:{s}:policy             (service) the policy's state_dict as JSON
    alma:{s}:daemon             (service) hash: pid, phase, heartbeat, started_at, rss_bytes, healthy,
                                degraded (JSON: the outages under way, stream_identity.py)
    alma:{s}:identity           (service) the stream's identity, also kept beside the model versions,
                                so that a Redis that came back empty is refused (stream_identity.py)
"""

from __future__ import annotations

from alma_daemon.data.wire import STREAM_NAME_RE


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

    def split(self, chunk: int) -> str:
        return f"{self.prefix}:split:{chunk}"

    @property
    def assembling(self) -> str:
        return f"{self.prefix}:assembling"

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
