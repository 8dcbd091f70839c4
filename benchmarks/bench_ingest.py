"""Ingest throughput (Kafka -> Redis) next to a plain kafka-python consumer, and the daemon's memory.

1. Throughput: a Tansu broker and a redis-server (the classes of tests/servers.py) on loopback; 20
   chunks of 500 CIFAR-10 images are published once. Each round then reads every record from
   offset 0 twice: with a plain ``KafkaConsumer`` (same fetch settings, records only counted) and
   with alma's ingest (validation, assembly, one MULTI/EXEC per poll into a flushed Redis).
   Reported: MB/s of record values, median over rounds, and ours / plain. For context, each round
   also times Redis alone absorbing the same bytes (SETs in transactions of one poll's size).
2. Memory: ``alma run --embedded`` over 500 MNIST chunks without replay (width-4 MLP, 1 epoch),
   fed by ``alma replay --embedded`` in another process; the daemon's RSS is sampled with psutil.

Run from the repository root (the two parts compete for CPU, so they run one after the other)::

    python benchmarks/bench_ingest.py            # writes benchmarks/results/ingest.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/servers.py holds the broker and Redis launchers

from alma_daemon.data.datasets import load_dataset  # noqa: E402
from alma_daemon.data.wire import StreamSchema  # noqa: E402
from alma_daemon.service.ingest.worker import IngestWorker  # noqa: E402
from alma_daemon.service.redis_keys import StreamKeys  # noqa: E402
from alma_daemon.transports.kafka import CONSUMER_SETTINGS, KafkaPublisher, KafkaSource  # noqa: E402
from alma_daemon.transports.replay import ReplayChunk, replay  # noqa: E402
from tests.servers import KafkaBroker, RedisServer  # noqa: E402

STREAM = "cifar"
TOPIC = "bench.cifar"


# -- 1. throughput ----------------------------------------------------------------------------------
def publish_cifar(broker: KafkaBroker, chunks: int, examples: int) -> None:
    train = load_dataset("cifar10").train
    stream = (
        ReplayChunk(
            i + 1, {"x": train.x[i * examples : (i + 1) * examples], "y": train.y[i * examples : (i + 1) * examples]}
        )
        for i in range(chunks)
    )
    replay(stream, KafkaPublisher(broker.bootstrap_servers, TOPIC), STREAM, progress=False)


def plain_consumer_seconds(broker: KafkaBroker, records: int) -> tuple[float, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False, **CONSUMER_SETTINGS
    )
    partition = TopicPartition(TOPIC, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    seen = size = 0
    start = time.perf_counter()
    while seen < records:
        for batch in consumer.poll(timeout_ms=500).values():
            seen += len(batch)
            size += sum(len(r.value) for r in batch)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed, size


def empty_redis(client) -> None:
    """FLUSHALL, then compact the AOF, so no AOF rewrite of earlier rounds' data runs during a round."""
    client.flushall()
    client.bgrewriteaof()
    while int(client.info("persistence")["aof_rewrite_in_progress"]) or int(
        client.info("persistence")["aof_rewrite_scheduled"]
    ):
        time.sleep(0.05)


def alma_ingest_seconds(broker: KafkaBroker, client, records: int) -> float:
    empty_redis(client)
    keys = StreamKeys(STREAM)
    schema = StreamSchema("labeled", (32, 32, 3), num_classes=10)
    worker = IngestWorker(KafkaSource(broker.bootstrap_servers, TOPIC), client, keys, schema, max_buffer_bytes=1 << 34)
    start = time.perf_counter()
    handled = 0
    while handled < records:
        handled += worker.step(timeout=0.5)
    worker.flush()  # the last batch's transaction is done: every record is in Redis
    elapsed = time.perf_counter() - start
    worker.stop()
    assert int(client.hget(keys.offsets, "0")) == records
    assert int(client.hget(keys.ingest, "records_rejected") or 0) == 0
    return elapsed


def bench_throughput(chunks: int, examples: int, rounds: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="alma-bench-ingest-"))
    broker, redis_server = KafkaBroker(workdir / "kafka"), RedisServer(workdir / "redis")
    broker.start()
    redis_server.start()
    client = redis_server.client(socket_timeout=60)
    try:
        broker.create_topic(TOPIC)
        publish_cifar(broker, chunks, examples)
        from kafka import KafkaConsumer, TopicPartition

        probe = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
        records = probe.end_offsets([TopicPartition(TOPIC, 0)])[TopicPartition(TOPIC, 0)]
        probe.close()
        plain, ours, redis_alone = [], [], []
        size = 0
        for _ in range(rounds):
            seconds, size = plain_consumer_seconds(broker, records)
            plain.append(size / seconds / 1e6)
            ours.append(size / alma_ingest_seconds(broker, client, records) / 1e6)
            redis_alone.append(size / redis_alone_seconds(client, records, size) / 1e6)
    finally:
        client.close()
        redis_server.stop()
        broker.stop()
    return {
        "chunks": chunks,
        "examples_per_chunk": examples,
        "records": records,
        "megabytes": size / 1e6,
        "rounds": rounds,
        "redis": "redis-server 7.0, AOF everysec, loopback TCP",
        "plain_consumer_mb_s": plain,
        "alma_ingest_mb_s": ours,
        "redis_alone_mb_s": redis_alone,
        "plain_consumer_mb_s_median": statistics.median(plain),
        "alma_ingest_mb_s_median": statistics.median(ours),
        "redis_alone_mb_s_median": statistics.median(redis_alone),
        "ratio_median": statistics.median(ours) / statistics.median(plain),
        "ratio_per_round_median": statistics.median(o / p for o, p in zip(ours, plain)),
    }


def redis_alone_seconds(client, records: int, size: int) -> float:
    """Context, not a competitor: the same bytes SET into Redis in transactions of one poll's size."""
    empty_redis(client)
    value = os.urandom(size // records)
    per_poll = max(1, CONSUMER_SETTINGS["max_partition_fetch_bytes"] // len(value))
    start = time.perf_counter()
    for first in range(0, records, per_poll):
        pipe = client.pipeline(transaction=True)
        for i in range(first, min(records, first + per_poll)):
            pipe.set(f"bench:{i}", value)
        pipe.execute()
    return time.perf_counter() - start


# -- 2. memory ----------------------------------------------------------------------------------------
def bench_memory(chunks: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="alma-bench-memory-"))
    common = [
        "--embedded",
        "--no-progress",
        "--set",
        f"daemon.state_dir={workdir / 'state'}",
        "--set",
        f"daemon.checkpoint_dir={workdir / 'model_store'}",
        "--set",
        f"stream.megabatches={chunks}",
        "--set",
        "stream.replay=false",
        "--set",
        "learner.width=4",
        "--set",
        "train.epochs=1",
    ]
    alma = [sys.executable, "-m", "alma_daemon"]
    start = time.monotonic()
    daemon = subprocess.Popen(
        [*alma, "run", "--until-chunks", str(chunks), *common],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    settings = workdir / "state" / "redis.db.settings"
    while not settings.exists():  # the daemon starts the embedded Redis; the replayer joins it
        if daemon.poll() is not None:
            raise RuntimeError(daemon.stderr.read().decode())
        time.sleep(0.2)
    replayer = subprocess.Popen(
        [*alma, "replay", "--dataset", "mnist", *common], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    import redis

    status = redis.Redis(unix_socket_path=json.loads(settings.read_text())["unixsocket"])
    process = psutil.Process(daemon.pid)
    samples = []
    while daemon.poll() is None:
        try:
            rss = process.memory_info().rss
            phase = (status.hget(StreamKeys("mnist").daemon, "phase") or b"").decode()
        except (psutil.NoSuchProcess, redis.RedisError):
            break
        chunk = int(phase.rsplit(" ", 1)[1]) if phase.startswith("processing chunk") else None
        samples.append({"seconds": round(time.monotonic() - start, 1), "chunk": chunk, "rss_bytes": rss})
        time.sleep(0.5)
    status.close()
    if daemon.wait() != 0 or replayer.wait() != 0:
        raise RuntimeError(f"daemon: {daemon.stderr.read().decode()}\nreplay: {replayer.stderr.read().decode()}")
    with_chunk = [s for s in samples if s["chunk"] is not None]
    by_hundred = {}
    for s in with_chunk:
        by_hundred.setdefault(s["chunk"] // 100 * 100, s["rss_bytes"])
    return {
        "chunks": chunks,
        "replay": False,
        "learner": "sm width 4",
        "epochs": 1,
        "rss_bytes_last_sample": with_chunk[-1]["rss_bytes"],
        "chunk_at_last_sample": with_chunk[-1]["chunk"],
        "rss_bytes_peak": max(s["rss_bytes"] for s in samples),
        "rss_bytes_first_at_chunk": {str(k): v for k, v in sorted(by_hundred.items())},
        "seconds": round(time.monotonic() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=20, help="CIFAR chunks published for the throughput part")
    parser.add_argument("--examples", type=int, default=500, help="images per CIFAR chunk")
    parser.add_argument("--rounds", type=int, default=7, help="reads of the topic per consumer")
    parser.add_argument("--memory-chunks", type=int, default=500, help="MNIST chunks for the memory part (0 = skip)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ingest.json"))
    args = parser.parse_args(argv)
    results = {
        "command": "python benchmarks/bench_ingest.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "python": platform.python_version(),
        },
        "throughput": bench_throughput(args.chunks, args.examples, args.rounds),
    }
    if args.memory_chunks:
        results["memory"] = bench_memory(args.memory_chunks)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
