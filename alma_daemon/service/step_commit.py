"""How a step ends in Redis: committed in one MULTI/EXEC, or its chunk discarded to the dead letters.

A commit moves the chunk out of ``ready`` and saves the buffer's membership, the engine's state
and the policy's state together: after a crash the daemon finds either all of a step or none of it
(docs/architecture.md, "A record's path": exactly once).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from alma_daemon import metrics
from alma_daemon.core.engine import Engine
from alma_daemon.data.wire import RejectedRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.engine_store import EngineStateStore
from alma_daemon.service.redis_buffer import ReadyChunks, RedisBuffer
from alma_daemon.service.redis_tx import dead_letter, watched_transaction
from alma_daemon.service.stream_identity import RedisRestarted, StreamIdentity

log = logging.getLogger(__name__)


class StepCommit:
    """Commits the daemon's steps for one stream."""

    def __init__(self, client: Any, keys: StreamKeys, state_store: EngineStateStore, identity: StreamIdentity):
        self.client = client
        self.keys = keys
        self.state_store = state_store
        self.identity = identity

    def commit(self, engine: Engine, buffer: RedisBuffer, ready: ReadyChunks, consumed: int | None) -> None:
        """Save the step: chunk ``consumed`` out of ``ready``, buffer membership, engine and policy state, atomically.

        Raises :class:`RedisRestarted` instead when Redis restarted while the step ran: the step's
        chunk and the buffer it trained on may be gone, so it is redone from what Redis holds.
        """
        with watched_transaction(self.client, self.keys.engine) as pipe:
            if self.identity.restarted():
                raise RedisRestarted("Redis restarted while the step ran; the step is redone")
            if consumed is not None:
                ready.stage_consume(pipe, consumed)
            buffer.stage_commit(pipe)
            self.state_store.stage_save(pipe, engine.state)
            pipe.set(self.keys.policy, json.dumps(engine.policy.state_dict()))
            pipe.execute()
        buffer.committed()
        self.state_store.committed()

    def discard(self, ready: ReadyChunks, chunk_id: int, rejection: RejectedRecord) -> None:
        """Take the ready chunk ``chunk_id`` out of ``ready`` into the dead letters, without a step."""
        with watched_transaction(self.client, self.keys.engine) as pipe:
            ready.stage_consume(pipe, chunk_id)
            dead_letter(pipe, self.keys, rejection.reason, rejection.detail, f"chunk {chunk_id}")
            pipe.execute()
        metrics.RECORDS_REJECTED.labels(rejection.reason).inc()
        log.warning(
            "ready chunk rejected", extra={"chunk": chunk_id, "reason": rejection.reason, "detail": rejection.detail}
        )
