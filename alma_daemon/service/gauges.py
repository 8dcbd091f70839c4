"""The daemon's buffer gauge: chunks held in Redis, ready or buffered for training."""

from __future__ import annotations

from alma_daemon import metrics
from alma_daemon.service.redis_buffer import ReadyChunks, RedisBuffer


def update_buffer_gauge(ready: ReadyChunks, buffer: RedisBuffer | None) -> None:
    """``alma_buffer_chunks``: ready chunks plus the buffer's pending and kept ones."""
    buffered = ready.count()
    if buffer is not None:
        buffered += len(buffer.pending_chunks()) + len(buffer.kept_chunks())
    metrics.BUFFER_CHUNKS.set(buffered)
