"""Start-up and reload: the engine as the last committed step left it (a fresh one on first start).

A step is either committed or not at all. After a crash the daemon reloads the committed state,
withdraws the checkpoint an uncommitted stage may have written (version = committed + 1; see
:func:`serving.publishing.live_pointer.withdraw`), loads the checkpoint of the committed version and redoes
the interrupted step. Every stage's randomness derives from (seed, stage), so the redone step and
the series equal an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from alma_daemon.config import Config, ConfigError, to_dict
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.stream_task import StreamTask
from alma_daemon.data.task_terms import features_misfit
from alma_daemon.data.wire import StreamSchema
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability.results import ResultsWriter
from alma_daemon.service.chunk_store import ChunkStore
from alma_daemon.service.engine_store import EngineStateStore
from alma_daemon.service.ingest.cutter import EventStream
from alma_daemon.service.redis_buffer import RedisBuffer
from serving.publishing.live_pointer import withdraw

log = logging.getLogger(__name__)


def stream_schema(task: TaskInfo, config: Config) -> StreamSchema:
    """What ingest accepts: examples of the task's input shape with labels in its class range (or
    its class names) or a regression's targets, or token runs of the task's vocabulary for a language
    model."""
    if task.kind == "language_model":
        if event_stream(config) is not None:
            raise ConfigError("stream.chunk_examples: event streams carry labeled examples; a text stream sends chunks")
        return StreamSchema("text", vocab_size=task.num_classes)
    misfit = features_misfit(config, task)
    if misfit is not None:
        raise ConfigError(misfit)
    return StreamSchema(
        "labeled",
        task.input_shape,
        num_classes=task.num_classes,
        pixel_range=task.pixels,
        classes=task.classes,
        regression=task.regression,
    )


def event_stream(config: Config) -> EventStream | None:
    """How to cut the stream into chunks when its records are labeled events; None for chunk records."""
    stream = config.stream
    if stream.chunk_examples is None and stream.chunk_seconds is None:
        return None
    return EventStream(stream.chunk_examples, stream.chunk_seconds, tuple(stream.features))


def restore_engine(
    config: Config,
    client: Any,
    keys: StreamKeys,
    state_store: EngineStateStore,
    stream: StreamTask,
    store: CheckpointStore,
    observers: list[EngineObserver],
) -> tuple[Engine, RedisBuffer]:
    """The engine and its Redis buffer as the last committed step left them."""
    state = state_store.load()
    version = state.model_version if state is not None else 0
    drop_uncommitted_checkpoints(store, version)
    if version and version not in store.versions():
        raise RuntimeError(
            f"the engine state in Redis ({keys.engine}) is at model version {version}, "
            f"but {store.folder} holds no complete version {version}"
        )
    buffer = RedisBuffer.open(client, keys, ChunkStore.for_config(config))
    raw_policy = client.get(keys.policy)
    # The results files in daemon.state_dir, written first after each step.
    results = ResultsWriter(config.daemon.state_dir, to_dict(config), history=True)
    engine = assemble_engine(
        config,
        stream.task,
        buffer,
        test_set=stream.test,
        checkpoints=store,
        state=state,
        policy_state=json.loads(raw_policy) if raw_policy is not None else None,
        observers=[results, *observers],
    )
    results.resume(engine)
    log.info(
        "engine restored",
        extra={
            "chunks_seen": engine.state.chunks_seen,
            "model_version": version,
            "pending": len(buffer.pending_chunks()),
        },
    )
    return engine, buffer


def drop_uncommitted_checkpoints(store: CheckpointStore, version: int) -> None:
    """Withdraw from serving and delete the checkpoint a stage wrote after committed ``version``
    (see :func:`serving.publishing.live_pointer.withdraw`).

    The folder is withdrawn even when incomplete (not a version to :meth:`CheckpointStore.versions`):
    a deletion cut short by a crash leaves one in the way of the redone step, and the next start
    ends it.
    """
    newer = [v for v in store.versions() if v > version]
    if newer and newer != [version + 1]:
        raise RuntimeError(
            f"{store.folder} holds versions {newer} newer than the committed model version "
            f"{version}: Redis has lost recent commits (restore it with its AOF), or the "
            f"versions belong to another run (use another daemon.checkpoint_dir)"
        )
    if store.path(version + 1).exists():
        log.warning("removing checkpoint of an uncommitted stage", extra={"version": version + 1})
        withdraw(store, version + 1)
