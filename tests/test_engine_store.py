"""The engine state in Redis: counters overwritten, per-chunk records appended, only on commit."""

from __future__ import annotations

import json

import pytest

from alma_daemon.core.engine import EngineState
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.engine_store import EngineStateStore, last_record

KEYS = StreamKeys("store")


def step(state: EngineState, t: int) -> None:
    state.chunks_seen = t
    state.cumulative_error += 0.1 * t
    state.series.append({"t": t, "test_error": 0.1 * t, "decision": "train"})


def save(client, store: EngineStateStore, state: EngineState, execute: bool = True) -> list:
    pipe = client.pipeline(transaction=True)
    store.stage_save(pipe, state)
    commands = [args[0] for args, _ in pipe.command_stack]
    if execute:
        pipe.execute()
        store.committed()
    else:
        pipe.reset()
    return commands


@pytest.mark.integration
def test_each_commit_appends_only_the_new_records_and_load_returns_the_whole_state(redis_db) -> None:
    store, state = EngineStateStore(redis_db, KEYS), EngineState(started_at=1.0)
    assert store.load() is None and last_record(redis_db, KEYS) is None
    for t in (1, 2, 3):
        step(state, t)
        assert save(redis_db, store, state) == ["SET", "RPUSH"]
        assert redis_db.llen(KEYS.series) == t
    assert "series" not in json.loads(redis_db.get(KEYS.engine))
    assert EngineStateStore(redis_db, KEYS).load() == state
    assert last_record(redis_db, KEYS) == state.series[-1]


@pytest.mark.integration
def test_a_step_that_never_commits_leaves_the_saved_state_as_it_was(redis_db) -> None:
    store, state = EngineStateStore(redis_db, KEYS), EngineState(started_at=1.0)
    step(state, 1)
    save(redis_db, store, state)
    committed = EngineStateStore(redis_db, KEYS).load()
    step(state, 2)
    save(redis_db, store, state, execute=False)  # the process dies before EXEC
    assert EngineStateStore(redis_db, KEYS).load() == committed

    resumed = EngineStateStore(redis_db, KEYS)
    state = resumed.load()
    step(state, 2)
    save(redis_db, resumed, state)
    assert [r["t"] for r in EngineStateStore(redis_db, KEYS).load().series] == [1, 2]


@pytest.mark.integration
def test_a_commit_without_a_new_record_rewrites_only_the_counters(redis_db) -> None:
    store, state = EngineStateStore(redis_db, KEYS), EngineState(started_at=1.0)
    step(state, 1)
    save(redis_db, store, state)
    state.stages_done = 1  # a policy tick trained between chunks: no new record
    assert save(redis_db, store, state) == ["SET"]
    assert EngineStateStore(redis_db, KEYS).load() == state


@pytest.mark.integration
def test_a_failed_commit_is_staged_again_whole_by_the_same_store(redis_db) -> None:
    store, state = EngineStateStore(redis_db, KEYS), EngineState(started_at=1.0)
    step(state, 1)
    save(redis_db, store, state, execute=False)  # EXEC never ran; the daemon redoes the step
    step(state, 2)
    save(redis_db, store, state)
    assert [r["t"] for r in EngineStateStore(redis_db, KEYS).load().series] == [1, 2]


@pytest.mark.integration
def test_with_a_row_limit_redis_and_memory_hold_the_newest_rows_only(redis_db) -> None:
    store, state = EngineStateStore(redis_db, KEYS, keep_rows=3), EngineState(started_at=1.0)
    for t in range(1, 8):
        step(state, t)
        assert save(redis_db, store, state) == ["SET", "RPUSH", "LTRIM"]
        assert [r["t"] for r in state.series] == list(range(max(1, t - 2), t + 1))
        assert redis_db.llen(KEYS.series) == min(t, 3)
    loaded = EngineStateStore(redis_db, KEYS, keep_rows=3).load()
    assert loaded == state and last_record(redis_db, KEYS)["t"] == 7
    # A limit lowered since: the newest rows of those Redis holds.
    assert [r["t"] for r in EngineStateStore(redis_db, KEYS, keep_rows=2).load().series] == [6, 7]
