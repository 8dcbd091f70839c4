"""Ingest throughput (Kafka -> Redis) next to a plain kafka-python consumer, and the daemon's memory.

1. Throughput: a Tansu broker and a redis-server (alma_daemon/local_servers/) on loopback; 20
   chunks of 500 CIFAR-10 images are published once. Each round then reads every record from
   offset 0 twice: with a plain ``KafkaConsumer`` (same fetch settings, records only counted) and
   with alma's ingest (validation, assembly, one MULTI/EXEC per poll into a flushed Redis).
   Reported: MB/s of record values, median over rounds, and ours / plain. For context, each round
   also times Redis alone absorbing the same bytes (SETs in transactions of one poll's size).
   ``--partitions 4`` spreads the chunks over four partitions (the reorder path of the assembler).
2. Memory: ``alma run --embedded`` over 500 MNIST chunks without replay (width-4 MLP, 1 epoch),
   fed by ``alma replay --embedded`` in another process; the daemon's RSS is sampled with psutil.
3. Events (``--events N``): N MNIST examples as JSON events (one a record, no key) in a topic of
   four partitions, produced once with confluent-kafka. Each round reads them all with a plain
   kafka-python consumer and a plain confluent-kafka consumer (each only reads, then reads and
   decodes every event with ``decode_event``), and with alma's ingest (kafka-python; events cut into
   chunks of 500 and committed to a flushed Redis). Reported: examples/s, median over rounds.

Run from the repository root (the parts compete for CPU, so they run one after the other)::

    python benchmarks/bench_ingest.py            # writes benchmarks/results/ingest.json
    python benchmarks/bench_ingest.py --memory-chunks 0 --events 20000 --out benchmarks/results/ingest_events.json
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

from alma_daemon.data.datasets import MNIST_TASK, load_dataset
from alma_daemon.data.events import decode_event, encode_events
from alma_daemon.data.wire import StreamSchema
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.local_servers.servers import KafkaBroker, RedisServer
from alma_daemon.service.ingest.cutter import EventStream
from alma_daemon.service.ingest.worker import IngestLimits, IngestWorker
from alma_daemon.transports.kafka import CONSUMER_SETTINGS, KafkaPublisher, KafkaSource
from alma_daemon.transports.replay import ReplayChunk, replay

REPO = Path(__file__).resolve().parents[1]

STREAM = "cifar"
TOPIC = "bench.cifar"


# -- 1. throughput ----------------------------------------------------------------------------------
def topic_partitions(broker: KafkaBroker, topic: str) -> tuple[list, int]:
    """The topic's partitions and the records they hold."""
    from kafka import KafkaConsumer, TopicPartition

    probe = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    partitions = [TopicPartition(topic, p) for p in sorted(probe.partitions_for_topic(topic))]
    records = sum(probe.end_offsets(partitions).values())
    probe.close()
    return partitions, records


def consumer_from_start(broker: KafkaBroker, topic: str):
    """A plain kafka-python consumer with the daemon's fetch settings, at offset 0 of every partition."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False, **CONSUMER_SETTINGS
    )
    partitions, _ = topic_partitions(broker, topic)
    consumer.assign(partitions)
    for partition in partitions:
        consumer.seek(partition, 0)
    return consumer


def publish_cifar(broker: KafkaBroker, chunks: int, examples: int) -> None:
    train = load_dataset("cifar10").train
    stream = (
        ReplayChunk(
            i + 1, {"x": train.x[i * examples : (i + 1) * examples], "y": train.y[i * examples : (i + 1) * examples]}
        )
        for i in range(chunks)
    )
    replay(stream, KafkaPublisher(broker.bootstrap_servers, TOPIC), STREAM, progress=False)


def plain_consumer_seconds(broker: KafkaBroker, records: int, topic: str = TOPIC) -> tuple[float, int]:

    consumer = consumer_from_start(broker, topic)
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
    worker = IngestWorker(KafkaSource(broker.bootstrap_servers, TOPIC), client, keys, schema, IngestLimits(1 << 34))
    start = time.perf_counter()
    handled = 0
    while handled < records:
        handled += worker.step(timeout=0.5)
    worker.flush()  # the last batch's transaction is done: every record is in Redis
    elapsed = time.perf_counter() - start
    worker.stop()
    assert sum(int(v) for v in client.hvals(keys.offsets)) == records
    assert int(client.hget(keys.ingest, "records_rejected") or 0) == 0
    return elapsed


def bench_throughput(chunks: int, examples: int, rounds: int, partitions: int = 1) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="alma-bench-ingest-"))
    broker, redis_server = KafkaBroker(workdir / "kafka"), RedisServer(workdir / "redis")
    broker.start()
    redis_server.start()
    client = redis_server.client(socket_timeout=60)
    try:
        broker.create_topic(TOPIC, partitions)
        publish_cifar(broker, chunks, examples)
        _, records = topic_partitions(broker, TOPIC)
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
        "partitions": partitions,
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


# -- 3. events -------------------------------------------------------------------------------------
EVENT_TOPIC = "bench.events"
EVENT_SCHEMA = StreamSchema("labeled", MNIST_TASK.input_shape, num_classes=MNIST_TASK.num_classes)


def publish_events(broker: KafkaBroker, events: int) -> None:
    from confluent_kafka import Producer

    train = load_dataset("mnist").train
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20})
    for record in encode_events(train.x[:events], train.y[:events]):
        producer.produce(EVENT_TOPIC, value=record.value, headers=record.headers)
        producer.poll(0)
    assert producer.flush(120) == 0


def kafka_python_events_seconds(broker: KafkaBroker, records: int, decode: bool) -> float:

    consumer = consumer_from_start(broker, EVENT_TOPIC)
    seen = 0
    start = time.perf_counter()
    while seen < records:
        for batch in consumer.poll(timeout_ms=500, max_records=512).values():
            seen += len(batch)
            if decode:
                for r in batch:
                    decode_event(r.value, r.headers, EVENT_SCHEMA)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def confluent_events_seconds(broker: KafkaBroker, records: int, decode: bool) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "bench", "enable.auto.commit": False}
    )
    partitions, _ = topic_partitions(broker, EVENT_TOPIC)
    consumer.assign([TopicPartition(EVENT_TOPIC, p.partition, OFFSET_BEGINNING) for p in partitions])
    seen = 0
    start = time.perf_counter()
    while seen < records:
        for message in consumer.consume(num_messages=512, timeout=0.5):
            if message.error():
                continue
            seen += 1
            if decode:
                decode_event(message.value(), message.headers(), EVENT_SCHEMA)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def alma_events_seconds(broker: KafkaBroker, client, records: int) -> float:
    empty_redis(client)
    keys = StreamKeys("events")
    worker = IngestWorker(
        KafkaSource(broker.bootstrap_servers, EVENT_TOPIC),
        client,
        keys,
        EVENT_SCHEMA,
        IngestLimits(1 << 34),
        events=EventStream(chunk_examples=500, chunk_seconds=None),
    )
    start = time.perf_counter()
    handled = 0
    while handled < records:
        handled += worker.step(timeout=0.5)
    worker.flush()
    elapsed = time.perf_counter() - start
    worker.stop()
    stored = int(client.hget(keys.ingest, "examples_received") or 0) + int(
        client.hget(keys.ingest, "open_examples") or 0
    )
    assert stored == records and int(client.hget(keys.ingest, "records_rejected") or 0) == 0
    return elapsed


def bench_events(events: int, rounds: int, partitions: int = 4) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="alma-bench-events-"))
    broker, redis_server = KafkaBroker(workdir / "kafka"), RedisServer(workdir / "redis")
    broker.start()
    redis_server.start()
    client = redis_server.client(socket_timeout=60)
    rates: dict[str, list[float]] = {
        "kafka_python_read": [],
        "kafka_python_read_decode": [],
        "confluent_kafka_read": [],
        "confluent_kafka_read_decode": [],
        "alma_ingest": [],
    }
    try:
        broker.create_topic(EVENT_TOPIC, partitions)
        publish_events(broker, events)
        # Every record is read: Tansu's end offsets lag what it holds, so they do not count them.
        records = events
        for _ in range(rounds):
            for decode in (False, True):
                suffix = "_read_decode" if decode else "_read"
                rates["kafka_python" + suffix].append(events / kafka_python_events_seconds(broker, records, decode))
                rates["confluent_kafka" + suffix].append(events / confluent_events_seconds(broker, records, decode))
            rates["alma_ingest"].append(events / alma_events_seconds(broker, client, records))
    finally:
        client.close()
        redis_server.stop()
        broker.stop()
    medians = {f"{name}_examples_s_median": statistics.median(values) for name, values in rates.items()}
    return {
        "events": events,
        "partitions": partitions,
        "format": "JSON, one MNIST example a record (784 pixel values), no key",
        "rounds": rounds,
        "chunk_examples": 500,
        **{f"{name}_examples_s": values for name, values in rates.items()},
        **medians,
        "alma_over_kafka_python_read_decode": medians["alma_ingest_examples_s_median"]
        / medians["kafka_python_read_decode_examples_s_median"],
        "alma_over_confluent_kafka_read_decode": medians["alma_ingest_examples_s_median"]
        / medians["confluent_kafka_read_decode_examples_s_median"],
    }


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
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the CIFAR topic")
    parser.add_argument("--no-throughput", action="store_true", help="skip the CIFAR throughput part")
    parser.add_argument("--memory-chunks", type=int, default=500, help="MNIST chunks for the memory part (0 = skip)")
    parser.add_argument("--events", type=int, default=0, help="MNIST JSON events for the events part (0 = skip)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ingest.json"))
    args = parser.parse_args(argv)
    results = {
        "command": "python benchmarks/bench_ingest.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "python": platform.python_version(),
        },
    }
    if not args.no_throughput:
        results["throughput"] = bench_throughput(args.chunks, args.examples, args.rounds, args.partitions)
    if args.events:
        results["events"] = bench_events(args.events, args.rounds)
    if args.memory_chunks:
        results["memory"] = bench_memory(args.memory_chunks)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
