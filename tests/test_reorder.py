"""The engine's choice of the next ready chunk (service/reorder.py): id order, a bounded wait, late chunks."""

from __future__ import annotations

import json

import pytest

from alma_daemon.config import build_config
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.reorder import NextChunk, ReorderGate
from alma_daemon.service.status import format_status, read_status
from alma_daemon.transports.redis_stream import RedisStreamPublisher
from alma_daemon.transports.replay import dataset_chunks, replay
from tests.helpers.daemon import engine_state, run_daemon, service_config


def test_the_next_id_is_taken_at_once_and_a_gap_holds_later_chunks_for_the_wait_only() -> None:
    gate = ReorderGate(wait_seconds=30)
    assert gate.choose([], 0, None, now=0) == NextChunk()
    assert gate.choose([1, 3], 0, None, now=0) == NextChunk(take=1)
    held = gate.choose([3, 4], 1, None, now=100)
    assert (held.take, held.missing, held.waiting, held.wait_left) == (None, 2, 2, 30)
    assert gate.choose([3, 4], 1, None, now=120).wait_left == 10  # the wait counts from when it began
    assert gate.choose([3, 4], 1, None, now=130) == NextChunk(take=3)  # the gap never filled: go on


def test_a_chunk_completing_after_a_later_one_was_taken_is_taken_at_once_as_late() -> None:
    gate = ReorderGate(wait_seconds=30)
    assert gate.choose([2, 5], 3, None, now=0) == NextChunk(take=2, late=True)
    assert gate.choose([5], 3, None, now=0).missing == 4


def test_a_gap_that_fills_in_time_ends_the_wait_and_a_new_gap_waits_afresh() -> None:
    gate = ReorderGate(wait_seconds=30)
    assert gate.choose([3], 1, None, now=0).missing == 2
    assert gate.choose([2, 3], 1, None, now=20) == NextChunk(take=2)
    assert gate.choose([3], 2, None, now=21) == NextChunk(take=3)
    held = gate.choose([5], 3, None, now=25)
    assert (held.missing, held.wait_left) == (4, 30)


def test_before_the_first_chunk_only_an_incomplete_lower_chunk_is_waited_for() -> None:
    """A stream's ids may start anywhere: with nothing lower seen, the lowest ready chunk is the first."""
    gate = ReorderGate(wait_seconds=30)
    assert gate.choose([7, 8], 0, None, now=0) == NextChunk(take=7)
    assert gate.choose([7, 8], 0, 9, now=0) == NextChunk(take=7)
    held = gate.choose([7, 8], 0, 6, now=0)
    assert (held.take, held.missing) == (None, 6)


def test_no_wait_configured_takes_the_lowest_ready_chunk_at_once() -> None:
    assert ReorderGate(wait_seconds=0).choose([3], 1, None, now=0) == NextChunk(take=3)


@pytest.mark.integration
def test_status_shows_chunks_waiting_on_a_missing_id_and_late_chunks(redis_db) -> None:
    keys = StreamKeys("gaps")
    redis_db.set(keys.engine, json.dumps({"chunks_seen": 4, "last_chunk": 3, "late_chunks": 1}))
    redis_db.zadd(keys.ready, {"5": 5, "6": 6})  # chunk 4 missing
    status = read_status(redis_db, keys)
    assert (status["chunks_waiting_on_gap"], status["chunks_late"]) == (2, 1)
    assert "2 waiting on a missing id, 1 taken late" in format_status(status)
    redis_db.zadd(keys.ready, {"4": 4})  # it came: nothing waits
    assert read_status(redis_db, keys)["chunks_waiting_on_gap"] == 0


@pytest.mark.integration
def test_the_daemon_waits_for_a_missing_chunk_then_goes_on_and_trains_it_late_when_it_comes(tmp_path, redis_db) -> None:
    """Chunks 1 and 3 arrive; the daemon takes 1, waits the reorder wait for 2, takes 3; then 2 arrives
    and is taken at once as a late step. The restart in between resumes from what was committed."""
    config = build_config(
        service_config(tmp_path, None, "gaps", stream={"megabatches": 3}, daemon={"reorder_wait_seconds": 0.5})
    )
    chunks = list(dataset_chunks(config))
    publisher = RedisStreamPublisher(redis_db, config.kafka.topic)
    replay([chunks[0], chunks[2]], publisher, "gaps", progress=False)
    run_daemon(config, redis_db, until=2)
    assert [r["chunk"] for r in engine_state(redis_db, "gaps")["series"]] == [1, 3]
    replay([chunks[1]], publisher, "gaps", progress=False)
    run_daemon(config, redis_db, until=3)
    state = engine_state(redis_db, "gaps")
    assert [(r["chunk"], r.get("late", False)) for r in state["series"]] == [(1, False), (3, False), (2, True)]
    assert state["late_chunks"] == 1 and state["last_chunk"] == 3 and redis_db.xlen(StreamKeys("gaps").dead) == 0
    assert read_status(redis_db, StreamKeys("gaps"))["chunks_late"] == 1
