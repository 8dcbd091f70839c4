"""The daemon: exact resume after a crash at any point, exactly-once across SIGKILL, dead letters, status, stop.

Small MNIST streams (a few hundred examples, width-8 MLP, 1-3 epochs) against real servers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from safetensors.torch import load_file

from alma_daemon.config import build_config
from alma_daemon.data.arrays import load_npz
from alma_daemon.data.datasets import load_dataset
from alma_daemon.data.streams import megabatch_stream, split_chunk
from alma_daemon.data.wire import MAX_ID, encode_chunk
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.infra.unreachable import ServerUnreachable
from alma_daemon.research.simulate import run_simulation
from alma_daemon.service.chunk_store import ChunkStore
from alma_daemon.service.daemon import Daemon
from alma_daemon.service.redis_buffer import RedisBuffer
from alma_daemon.service.replay_thread import ReplayThread
from alma_daemon.service.status import format_status, read_status
from alma_daemon.transports.kafka import KafkaPublisher
from alma_daemon.transports.redis_stream import RedisStreamPublisher, encode_entry
from alma_daemon.transports.replay import (
    RecordFormat,
    ReplayChunk,
    ReplayPace,
    dataset_chunks,
    labeled_chunks,
    replay,
    text_chunks,
)
from tests.helpers.daemon import (
    PROCESS_LIMIT_SECONDS,
    REPO,
    Crash,
    CrashOnce,
    engine_state,
    exact,
    finish,
    run_daemon,
    service_config,
    sigkill,
    start_daemon,
    wait_until,
    write_config,
)
from tests.helpers.records import bad_records, records_of
from tests.helpers.servers import free_port
from tests.helpers.text import TINY_LM, corpus

# -- in process: a crash at any point of a step -----------------------------------------------------


@pytest.mark.integration
def test_a_start_up_that_fails_half_way_closes_what_it_opened(tmp_path, redis_db) -> None:
    """The metrics port is taken: the daemon fails, and puts the signal handlers back (it ran its shutdown)."""

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    config = build_config(service_config(tmp_path, None, "halfway", metrics={"port": taken.getsockname()[1]}))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    daemon = Daemon(config, redis_db, until_chunks=1)
    try:
        with pytest.raises(ServerUnreachable, match="metrics.port"):
            daemon.run()
    finally:
        taken.close()
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


@pytest.mark.integration
def test_a_daemon_killed_at_any_point_resumes_to_the_uninterrupted_series(tmp_path, redis_db) -> None:
    runs = {}
    for stream in ("reference", "crashed"):
        # The daemon is handed the client; redis.url is only read by `alma run`.
        config = build_config(service_config(tmp_path, None, stream))
        replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), stream, progress=False)
        runs[stream] = config
    run_daemon(runs["reference"], redis_db, until=4)

    crashed = runs["crashed"]
    with pytest.raises(Crash):
        run_daemon(crashed, redis_db, until=4, observers=[CrashOnce("checkpoint", 2)])
    assert engine_state(redis_db, "crashed")["model_version"] == 1
    with pytest.raises(Crash):
        run_daemon(crashed, redis_db, until=4, observers=[CrashOnce("step", 3)])
    assert engine_state(redis_db, "crashed")["chunks_seen"] == 2
    run_daemon(crashed, redis_db, until=4)

    reference, resumed = engine_state(redis_db, "reference"), engine_state(redis_db, "crashed")
    assert [r["chunk"] for r in resumed["series"]] == [1, 2, 3, 4]
    assert exact(resumed["series"]) == exact(reference["series"])
    last = {
        s: Path(c.daemon.checkpoint_dir) / c.serving.model_name / "4" / "weights.safetensors" for s, c in runs.items()
    }
    weights = {s: load_file(str(p)) for s, p in last.items()}
    assert weights["reference"].keys() == weights["crashed"].keys()
    assert all(torch.equal(weights["reference"][k], weights["crashed"][k]) for k in weights["reference"])
    versions = [name for name in os.listdir(last["crashed"].parents[1]) if name.isdigit()]
    assert sorted(versions) == ["1", "2", "3", "4"]  # the live pointer and its lock sit beside them
    results = json.loads((Path(crashed.daemon.state_dir) / "results.json").read_text())
    assert exact(results["series"]) == exact(reference["series"])


# -- subprocesses against real servers ----------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_sigkill_during_ingestion_and_training_loses_no_example_and_trains_none_twice(
    tmp_path, kafka_broker, redis_server, redis_db
) -> None:
    stream = "killed"
    data = service_config(
        tmp_path,
        redis_server.url,
        stream,
        stream={"megabatches": 6, "train_examples": 900, "replay": True},
        train={"epochs": 3, "patience": 3},
        kafka={"transport": "kafka", "bootstrap_servers": kafka_broker.bootstrap_servers},
    )
    config = build_config(data)
    config_path = write_config(tmp_path, data)
    keys = StreamKeys(stream)
    publisher = KafkaPublisher(kafka_broker.bootstrap_servers, config.kafka.topic)
    # ~20 KB parts: each 150-example chunk is 6 records, published at 2 chunks/s while the daemon ingests.
    producer = threading.Thread(
        target=replay,
        args=(dataset_chunks(config), publisher, stream),
        kwargs={"pace": ReplayPace(rate=2.0), "wire": RecordFormat(max_part_bytes=20_000), "progress": False},
    )
    daemon = start_daemon(config_path)
    wait_until(lambda: redis_db.hget(keys.daemon, "phase") == b"waiting", "waiting", daemon)
    producer.start()
    received = lambda: int(redis_db.hget(keys.ingest, "chunks_received") or 0)  # noqa: E731
    wait_until(lambda: received() >= 2, "two chunks received", daemon)
    sigkill(daemon)  # during ingestion: more records keep arriving
    producer.join()

    daemon = start_daemon(config_path)
    processing = lambda: (redis_db.hget(keys.daemon, "phase") or b"").startswith(b"processing")  # noqa: E731
    wait_until(
        lambda: engine_state(redis_db, stream).get("chunks_seen", 0) >= 2 and processing(),
        "processing a chunk after two",
        daemon,
    )
    sigkill(daemon)  # while evaluating/training on a chunk: the step is not committed
    finish(start_daemon(config_path, "--until-chunks", "6"))

    produced = list(megabatch_stream(load_dataset("mnist").train, 6, 0, limit=900))
    ingest = redis_db.hgetall(keys.ingest)
    assert int(ingest[b"chunks_received"]) == 6 and int(ingest[b"examples_received"]) == 900
    assert redis_db.xlen(keys.dead) == 0
    buffer = RedisBuffer(redis_db, keys, ChunkStore.for_config(config))
    assert buffer.kept_chunks() == [1, 2, 3, 4, 5, 6] and buffer.pending_chunks() == []
    for chunk in produced:  # every example buffered once, bit for bit, split as the simulator splits it
        expected = split_chunk(chunk, config.stream.val_fraction, config.stream.seed)
        stored = buffer.split(chunk.index)
        for got, part in ((stored.train, expected.train), (stored.val, expected.val)):
            assert torch.equal(got.x, part.x) and torch.equal(got.y, part.y)
    state = engine_state(redis_db, stream)
    assert state["chunks_seen"] == 6 and state["stages_done"] == 6 and state["model_version"] == 6
    simulated = run_simulation(config, progress=False)
    assert exact(state["series"]) == exact(simulated["series"])


@pytest.mark.integration
def test_bad_records_are_dead_lettered_while_the_daemon_runs_and_sigterm_stops_it(
    tmp_path, redis_server, redis_db
) -> None:
    stream = "deadletters"
    data = service_config(tmp_path, redis_server.url, stream)
    config_path = write_config(tmp_path, data)
    keys = StreamKeys(stream)
    daemon = start_daemon(config_path)
    wait_until(lambda: redis_db.hget(keys.daemon, "phase") == b"waiting", "waiting", daemon)

    mnist = {"stream": stream, "shape": (28, 28), "classes": 10}
    bad = bad_records(max_part_bytes=900 * 1024, **mnist)
    # Chunk 3 first, so that the bad part of chunk 2 comes after a newer chunk was completed.
    records = (
        records_of(3, n=20, max_part_bytes=900 * 1024, **mnist)
        + list(bad.values())
        + records_of(4, n=20, max_part_bytes=900 * 1024, **mnist)
    )
    for record in records:
        redis_db.xadd(data["kafka"]["topic"], encode_entry(record))
    wait_until(lambda: engine_state(redis_db, stream).get("chunks_seen") == 2, "chunks 3 and 4 processed", daemon)

    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "alma_daemon", "status", "--config", str(config_path), "--json"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=PROCESS_LIMIT_SECONDS,
        ).stdout
    )
    assert status["daemon"]["running"] is True
    assert status["chunks_received"] == 2 and status["chunks_trained"] == 2 and status["model_version"] == 2
    assert status["records_rejected"] == len(bad) and status["cer"] is not None
    assert status["rejected_by_reason"] == {reason: 1 for reason in bad}
    assert status["last_decision"]["action"] == "train"

    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=PROCESS_LIMIT_SECONDS) == 0, daemon.stdout.read().decode()
    assert redis_db.hget(keys.daemon, "phase") == b"stopped"
    assert (Path(data["daemon"]["state_dir"]) / "results.json").is_file()


@pytest.mark.integration
def test_a_replay_that_fails_stops_the_daemon_instead_of_leaving_it_waiting() -> None:
    """Nothing else feeds an `alma run --replay` stream: its daemon must not wait for chunks forever."""
    config = build_config({}, ["kafka.transport=redis"])
    nothing_there = redis.Redis(port=free_port(), socket_connect_timeout=1)
    stop = threading.Event()
    replayer = ReplayThread(config, nothing_there, threading.Event(), on_failure=stop.set)
    replayer.start()
    assert stop.wait(60), "the failed replay did not ask the daemon to stop"
    replayer.stop()
    assert replayer.error is not None


@pytest.mark.integration
@pytest.mark.slow
def test_embedded_run_with_replay_is_one_command(tmp_path) -> None:
    state_dir = tmp_path / "state"
    common = [
        "--set",
        f"daemon.state_dir={state_dir}",
        "--set",
        f"daemon.checkpoint_dir={tmp_path / 'ms'}",
        "--set",
        "stream.megabatches=3",
        "--set",
        "stream.train_examples=300",
        "--set",
        "learner.width=4",
        "--set",
        "train.epochs=1",
        "--set",
        "dataset.test_examples=100",
    ]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "alma_daemon",
            "run",
            "--embedded",
            "--replay",
            "mnist",
            "--until-chunks",
            "3",
            "--no-progress",
            *common,
        ],
        cwd=REPO,
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert run.returncode == 0, run.stderr.decode()
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "alma_daemon", "status", "--embedded", "--json", *common],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=PROCESS_LIMIT_SECONDS,
        ).stdout
    )
    assert status["chunks_trained"] == 3 and status["model_version"] == 3 and status["daemon"]["running"] is False
    settings = (
        json.loads((state_dir / "redis.db.settings").read_text()) if (state_dir / "redis.db.settings").exists() else {}
    )
    assert not settings or not Path(settings["pidfile"]).exists(), "the embedded redis-server outlived its users"


@pytest.mark.integration
def test_a_users_npz_arrays_stream_through_the_daemon_with_the_declared_task(tmp_path, redis_db) -> None:
    g = np.random.default_rng(0)
    y = g.integers(0, 3, 90)
    x = (g.random((90, 6)) * 50 + y[:, None] * 60).astype(np.float32)  # class written into the values
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=x[:30], y=y[:30])
    config = build_config(
        service_config(
            tmp_path,
            None,
            "arrays",
            dataset={"name": "arrays", "input_shape": [6], "num_classes": 3, "test_file": str(tmp_path / "test.npz")},
            stream={"megabatches": 3, "train_examples": None},
        )
    )
    replay(
        labeled_chunks(load_npz(tmp_path / "train.npz"), config),
        RedisStreamPublisher(redis_db, config.kafka.topic),
        "arrays",
        progress=False,
    )
    # Published before the daemon starts, so one poll reads all four records: the rejection is
    # committed with chunk 1, before the daemon stops at chunk 3.
    wrong_shape = {"x": torch.zeros(5, 7), "y": torch.zeros(5, dtype=torch.int64)}
    for record in encode_chunk("arrays", 4, **wrong_shape):
        redis_db.xadd(config.kafka.topic, encode_entry(record))
    run_daemon(config, redis_db, until=3)

    state = engine_state(redis_db, "arrays")
    assert [r["chunk"] for r in state["series"]] == [1, 2, 3]
    assert all(r["test_error"] is not None for r in state["series"])
    dead = redis_db.xrange(StreamKeys("arrays").dead)
    assert [fields[b"reason"] for _, fields in dead] == [b"shape"]


@pytest.mark.integration
def test_a_chunk_id_far_ahead_is_dead_lettered_and_the_next_chunks_are_trained_on(tmp_path, redis_db) -> None:
    """A valid chunk whose id is near 2**53 must not end the stream: unbounded, it completed, and every
    later chunk was older than the newest completed one, rejected for good."""
    config = build_config(service_config(tmp_path, None, "ahead", stream={"megabatches": 3}))
    chunks = list(dataset_chunks(config))
    wild = ReplayChunk(MAX_ID, chunks[0].tensors)
    replay([chunks[0], wild, *chunks[1:]], RedisStreamPublisher(redis_db, config.kafka.topic), "ahead", progress=False)
    run_daemon(config, redis_db, until=2)
    assert [r["chunk"] for r in engine_state(redis_db, "ahead")["series"]] == [1, 2]
    run_daemon(config, redis_db, until=3)  # a restart bounds ids from the newest completed chunk in Redis

    state = engine_state(redis_db, "ahead")
    assert exact(state["series"]) == exact(run_simulation(config, progress=False)["series"])
    keys = StreamKeys("ahead")
    dead = redis_db.xrange(keys.dead)
    assert [fields[b"reason"] for _, fields in dead] == [b"chunk_ahead"]
    assert f"chunk {MAX_ID} of stream 'ahead' is {MAX_ID - 1} ids ahead of chunk 1".encode() in dead[0][1][b"detail"]
    assert int(redis_db.hget(keys.ingest, "rejected:chunk_ahead")) == 1


@pytest.mark.integration
def test_only_committed_checkpoints_are_published(tmp_path, redis_db) -> None:
    from serving.publishing import make_publisher

    config = build_config(
        service_config(tmp_path, None, "published", serving={"kind": "local", "promotion_margin": 1.0})
    )
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), "published", progress=False)
    with pytest.raises(Crash):
        run_daemon(config, redis_db, until=4, observers=[CrashOnce("checkpoint", 2)])
    assert make_publisher(config).live_version() in (None, 1)  # version 2 was written, never committed
    run_daemon(config, redis_db, until=4)
    assert make_publisher(config).live_version() == 4  # margin 1.0: the guard promotes every version


@pytest.mark.integration
def test_without_a_publisher_the_daemon_keeps_only_the_newest_checkpoints(tmp_path, redis_db) -> None:
    config = build_config(
        service_config(
            tmp_path, None, "kept", stream={"megabatches": 5}, serving={"kind": "none"}, daemon={"keep_checkpoints": 2}
        )
    )
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), "kept", progress=False)
    daemon = run_daemon(config, redis_db, until=5)
    assert daemon.engine.state.model_version == 5
    assert daemon.store.versions() == [4, 5]


@pytest.mark.integration
def test_the_daemon_holds_its_newest_rows_and_its_files_every_row_once_after_a_crash(tmp_path, redis_db) -> None:
    from alma_daemon.observability.results import read_results

    config = build_config(service_config(tmp_path, None, "rows", stream={"megabatches": 5}, daemon={"series_rows": 2}))
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), "rows", progress=False)
    with pytest.raises(Crash):
        run_daemon(config, redis_db, until=5, observers=[CrashOnce("step", 3)])
    daemon = run_daemon(config, redis_db, until=5)
    assert [r["t"] for r in daemon.engine.state.series] == [4, 5]
    assert redis_db.llen(StreamKeys("rows").series) == 2
    assert json.loads(redis_db.hget(StreamKeys("rows").daemon, "freshness_bound")) == {
        "chunks": None,
        "examples": None,
        "seconds": 86400.0,
    }
    rows = read_results(config.daemon.state_dir)["series"]
    assert [r["t"] for r in rows] == [1, 2, 3, 4, 5]
    csv_lines = (Path(config.daemon.state_dir) / "series.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in csv_lines] == ["t", "1", "2", "3", "4", "5"]


@pytest.mark.integration
def test_a_text_corpus_streams_through_the_daemon_as_the_simulator_streams_it(tmp_path, redis_db) -> None:
    config = build_config(
        service_config(
            tmp_path,
            None,
            "text",
            dataset={"name": "text", "files": corpus(tmp_path), "vocab_size": 300},
            stream={"megabatches": 2, "seq_len": 16, "train_examples": None},
            learner=TINY_LM,
            train={"batch_size": 8, "steps_per_chunk": 3, "warmup_steps": 1},
        )
    )
    chunks = list(text_chunks(config))
    # Chunk 3 is a run of tokens too short for one sequence: it is dead-lettered and the stream goes
    # on with chunk 4 (chunk 2's text again).
    too_short = ReplayChunk(3, {"tokens": torch.zeros(4, dtype=torch.int32)})
    replay(
        [*chunks, too_short, ReplayChunk(4, chunks[1].tensors)],
        RedisStreamPublisher(redis_db, config.kafka.topic),
        "text",
        progress=False,
    )
    run_daemon(config, redis_db, until=3)

    served = engine_state(redis_db, "text")["series"]
    simulated = run_simulation(config, progress=False)["series"]
    assert [r["chunk"] for r in served] == [1, 2, 4] and served[-1]["test_perplexity"] > 1
    keys = ("chunk", "examples_seen", "test_perplexity", "prequential_perplexity", "train_flops", "parameters")
    assert [[r[k] for k in keys] for r in served[:2]] == [[r[k] for k in keys] for r in simulated]
    dead = redis_db.xrange(StreamKeys("text").dead)
    assert [fields[b"reason"] for _, fields in dead] == [b"shape"]
    status = read_status(redis_db, StreamKeys("text"))
    assert status["last_test_perplexity"] == served[-1]["test_perplexity"] and status["cer"] is None
    assert f"test perplexity   {served[-1]['test_perplexity']:.2f}" in format_status(status)
