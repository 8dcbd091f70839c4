"""The daemon on a stream that never ends: 10,000 chunks through real Redis and Kafka, killed -9 three times.

A service runs for months; what it holds must stay bounded (issue 43). This benchmark starts Debian's
Redis and the Tansu broker (Kafka protocol) on free loopback ports, publishes a River stream as
``--chunks`` small chunks with ``alma replay`` and runs ``alma run`` on it with every bound on:

- the freshness bound ``policy.max_model_age_chunks`` (under ``adaptive``, whose wait grows with the
  stream);
- replay bounded to a window (``stream.replay_keep: window``, ``stream.replay_examples``), its chunks in
  the chunk store on disk (``redis.chunk_store``), not in Redis;
- the stage cap ``train.max_stage_examples``;
- the model store kept to ``daemon.keep_checkpoints`` versions.

At three random chunk counts the daemon is killed with SIGKILL and started again. A sampler reads,
every ``--sample-seconds``, the daemon's RSS (its pid from the status hash in Redis), Redis's
``used_memory``, the chunk store's and the model store's bytes. Afterwards the committed series (in
Redis) gives, per chunk, the time outside training, each stage's seconds and the model's age.

Targets (printed as pass / FAIL and written to ``benchmarks/results/soak.json``):

- RSS and Redis used memory flat within 10 % after the first 1,000 chunks (max / min of the samples;
  RSS within each daemon process, from its own start, since a restarted process starts smaller);
  ``redis.max_buffer_bytes`` (``--buffer-bytes``) keeps what the producer sent ahead in Kafka;
- the chunk store bounded by the replay set (its bytes after the first 1,000 chunks at most the
  bytes of ``replay_examples`` examples plus the pending chunks');
- stage seconds bounded (no trend: the last tenth's median within 1.5 x the second tenth's);
- model age never above the bound;
- every chunk processed exactly once (the series holds each chunk id once) and trained once (each
  chunk id in exactly one stage's chunks, or dropped by the stage cap and counted).

The figure is ``docs/figures/soak.png``. Run from the repository root (about 20-40 minutes on 2 cores)::

    nice python benchmarks/bench_soak.py                    # 10,000 chunks, kills at 3 random points
    nice python benchmarks/bench_soak.py --chunks 1500 --out /tmp/soak.json --figure /tmp/soak.png   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "soak.json"
FIGURE = REPO / "docs" / "figures" / "soak.png"
STREAM = "soak"
#: Chunks whose samples are left out of the flatness targets: the daemon's start-up and first stages.
WARMUP_CHUNKS = 1000


def config(args: argparse.Namespace, redis_url: str, bootstrap: str, state_dir: Path) -> dict:
    return {
        "dataset": {
            "name": "river",
            "river_stream": args.river_stream,
            # River's streams hold out their last tenth as the test set.
            "river_examples": -(-args.chunks * args.chunk_examples * 10 // 9),
        },
        "stream": {
            "megabatches": args.chunks,
            "seed": args.seed,
            "replay": True,
            "replay_keep": "window",
            "replay_examples": args.replay_examples,
            "prequential_window": 50,
        },
        "learner": {"name": "sm", "width": 32},
        "train": {"epochs": 3, "patience": 1, "batch_size": 64, "max_stage_examples": args.max_stage_examples},
        "policy": {
            "name": "adaptive",
            "max_model_age_chunks": args.max_age,
            **({"max_model_age_examples": args.max_age_examples} if args.max_age_examples else {}),
        },
        "kafka": {"bootstrap_servers": bootstrap, "topic": "alma.soak"},
        # Backpressure: the producer runs far ahead of training, and what it sent waits in Kafka, not Redis.
        "redis": {"url": redis_url, "max_buffer_bytes": args.buffer_bytes},
        "daemon": {
            "stream": STREAM,
            "state_dir": str(state_dir),
            "checkpoint_dir": str(state_dir / "model_store"),
            "keep_checkpoints": 20,
            "poll_seconds": 1.0,
        },
        "serving": {"kind": "local"},
        "metrics": {"port": 0},
        "seed": args.seed,
    }


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # deleted while walking
    return total


class Daemon:
    """``alma run`` as its own process group, so a kill takes nothing else with it."""

    def __init__(self, config_file: Path, chunks: int, log: Path):
        self.command = [sys.executable, "-m", "alma_daemon", "run", "--config", str(config_file)]
        self.command += ["--until-chunks", str(chunks)]
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=out, stderr=out, start_new_session=True)

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def exit_code(self) -> int | None:
        return self.process.poll() if self.process else None


def read_stages(model_store: Path, stages: dict[int, dict]) -> None:
    """Add to ``stages`` (version -> its metrics.json) the versions on disk now: the store keeps only the
    newest, so the sampler reads them as they come. A version redone after a kill replaces the first."""
    for metrics in model_store.glob("*/*/metrics.json"):
        try:
            stages[int(metrics.parent.name)] = json.loads(metrics.read_text())
        except (OSError, ValueError):
            pass  # being written or deleted right now: read at the next sample


def sample(client, keys_prefix: str, chunk_store: Path, model_store: Path) -> dict:
    pid = client.hget(f"{keys_prefix}:daemon", "pid")
    rss = None
    if pid:
        try:
            rss = psutil.Process(int(pid)).memory_info().rss
        except psutil.Error:
            rss = None
    return {
        "at": time.time(),
        "chunk": json.loads(client.get(f"{keys_prefix}:engine") or "{}").get("chunks_seen", 0),
        "rss_bytes": rss,
        "redis_used_bytes": int(client.info("memory")["used_memory"]),
        "chunk_store_bytes": folder_bytes(chunk_store),
        "model_store_bytes": folder_bytes(model_store),
    }


def run(args: argparse.Namespace) -> dict:
    from alma_daemon.local_servers.servers import KafkaBroker, RedisServer
    from alma_daemon.observability.results import read_results

    work = Path(tempfile.mkdtemp(prefix="alma-soak-"))
    redis_server, broker = RedisServer(work / "redis"), KafkaBroker(work / "kafka")
    redis_server.start()
    broker.start()
    try:
        state_dir = work / "daemon"
        config_file = work / "soak.yaml"
        config_file.write_text(yaml.safe_dump(config(args, redis_server.url, broker.bootstrap_servers, state_dir)))
        client = redis_server.client()
        prefix = f"alma:{{{STREAM}}}"
        chunk_store, model_store = state_dir / "chunks", state_dir / "model_store"
        rng = random.Random(args.seed)
        kills = sorted(rng.sample(range(args.chunks // 10, args.chunks * 9 // 10), args.kills))
        print(f"soak: {args.chunks} chunks of {args.chunk_examples}; SIGKILL at chunks {kills}; work in {work}")

        daemon = Daemon(config_file, args.chunks, work / "daemon.log")
        daemon.start()
        producer = subprocess.Popen(
            [sys.executable, "-m", "alma_daemon", "replay", "--config", str(config_file)],
            cwd=REPO,
            stdout=(work / "replay.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        samples, killed_at, stages = [], [], {}
        started = time.time()
        while True:
            time.sleep(args.sample_seconds)
            now = sample(client, prefix, chunk_store, model_store)
            samples.append(now)
            read_stages(model_store, stages)
            if kills and now["chunk"] >= kills[0]:
                kills.pop(0)
                daemon.kill()
                killed_at.append(now["chunk"])
                print(f"  killed -9 at chunk {now['chunk']}; starting again")
                daemon.start()
            code = daemon.exit_code()
            if code is not None:
                if code != 0:
                    raise RuntimeError(f"alma run exited {code}: see {work / 'daemon.log'}")
                break
            if len(samples) % 30 == 0:
                print(f"  chunk {now['chunk']} of {args.chunks}, {time.time() - started:.0f} s")
        producer.wait(timeout=60)
        read_stages(model_store, stages)
        # Redis and results.json hold the newest daemon.series_rows rows; series.jsonl holds every one.
        series = read_results(state_dir)["series"]
        pending = [int(c) for c in client.zrange(f"{prefix}:pending", 0, -1)]
        return judge(args, series, samples, killed_at, stages, pending, time.time() - started)
    finally:
        broker.stop()
        redis_server.stop()


def flat(values: list[float]) -> float:
    """max / min: 1.10 is "flat within 10 %"."""
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def judge(
    args: argparse.Namespace,
    series: list[dict],
    samples: list[dict],
    killed_at: list[int],
    stages: dict[int, dict],
    pending: list[int],
    wall: float,
) -> dict:
    chunks = [row["chunk"] for row in series]
    trained_by_stage: dict[int, int] = {}
    dropped = 0
    for stage in stages.values():
        for chunk in stage.get("chunks") or []:
            trained_by_stage[chunk] = trained_by_stage.get(chunk, 0) + 1
        dropped += len(stage.get("skipped") or [])
    stage_seconds = [row["train_seconds"] for row in series if row.get("trained")]
    tenth = max(1, len(stage_seconds) // 10)
    outside = [
        later["wall_seconds"] - earlier["wall_seconds"] - later["train_seconds"]
        for earlier, later in zip(series, series[1:], strict=False)
        if later["wall_seconds"] >= earlier["wall_seconds"]  # a restart resets nothing, but be safe
    ]
    warmup = min(WARMUP_CHUNKS, args.chunks // 10)
    after = [s for s in samples if s["chunk"] >= warmup]
    # A restarted daemon is a new process: its memory is judged from its own start, past its first chunks.
    starts = [0, *killed_at]
    segments = [
        [s["rss_bytes"] for s in after if s["rss_bytes"] and start + warmup // 10 <= s["chunk"] < end]
        for start, end in zip(starts, [*killed_at, args.chunks + 1], strict=True)
    ]
    rss_ratio = max((flat(segment) for segment in segments if segment), default=float("nan"))
    rss = [s["rss_bytes"] for s in after if s["rss_bytes"]]
    redis_used = [s["redis_used_bytes"] for s in after]
    store = [s["chunk_store_bytes"] for s in after]
    bytes_per_example = 4 * 40 + 8  # float32 features of the widest River stream here, and a label
    store_bound = (args.replay_examples + args.max_age * args.chunk_examples) * bytes_per_example * 2
    ages = [row.get("model_age_chunks") or 0 for row in series]
    targets = {
        "rss_flat_within_10pct": rss_ratio <= 1.10,
        "redis_flat_within_10pct": flat(redis_used) <= 1.10,
        "chunk_store_bounded": bool(store) and max(store) <= store_bound,
        "stage_seconds_bounded": statistics.median(stage_seconds[-tenth:])
        <= 1.5 * statistics.median(stage_seconds[tenth : 2 * tenth] or stage_seconds),
        "model_age_within_bound": max(ages) <= args.max_age,
        "every_chunk_processed_once": sorted(chunks) == sorted(set(chunks)) and len(chunks) == args.chunks,
        # Stages read: every version the model store held at some sample (it keeps the newest only).
        "every_stage_read": len(stages) == len(stage_seconds),
        "every_chunk_trained_once": all(n == 1 for n in trained_by_stage.values())
        and len(trained_by_stage) + dropped + len(pending) == args.chunks,
    }
    return {
        "command": "nice python benchmarks/bench_soak.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "chunks": args.chunks,
        "bin_chunks": args.bin_chunks,
        "chunk_examples": args.chunk_examples,
        "river_stream": args.river_stream,
        "bounds": {
            "max_model_age_chunks": args.max_age,
            "replay_examples": args.replay_examples,
            "max_stage_examples": args.max_stage_examples,
            "keep_checkpoints": 20,
            "max_buffer_bytes": args.buffer_bytes,
        },
        "killed_at_chunks": killed_at,
        "wall_seconds": wall,
        "stages": len(stage_seconds),
        "chunks_dropped_by_stage_cap": dropped,
        "chunks_pending_at_the_end": len(pending),
        "rss_mib": {"min": min(rss) / 2**20, "max": max(rss) / 2**20, "ratio_within_a_process": rss_ratio}
        if rss
        else None,
        "redis_used_mib": {"min": min(redis_used) / 2**20, "max": max(redis_used) / 2**20, "ratio": flat(redis_used)},
        "chunk_store_mib": {"max": max(store) / 2**20, "bound": store_bound / 2**20} if store else None,
        "model_store_mib_max": max(s["model_store_bytes"] for s in samples) / 2**20,
        "stage_seconds": {
            "median_second_tenth": statistics.median(stage_seconds[tenth : 2 * tenth] or stage_seconds),
            "median_last_tenth": statistics.median(stage_seconds[-tenth:]),
            "max": max(stage_seconds),
        },
        "seconds_outside_training_per_chunk": {
            "median": statistics.median(outside),
            "p99": sorted(outside)[int(0.99 * (len(outside) - 1))],
        },
        "model_age_max": max(ages),
        "served_error_second_half": statistics.fmean(
            r["prequential_error"] for r in series[len(series) // 2 :] if r.get("prequential_error") is not None
        ),
        "targets": targets,
        "samples": samples,
        "stages_at": [[r["chunk"], round(r["train_seconds"], 4)] for r in series if r.get("trained")],
        "per_bin": per_bin(series, args.bin_chunks),
    }


def per_bin(series: list[dict], size: int) -> list[dict]:
    """Per ``size`` chunks: the time outside training (median and max, ms) and the model's oldest age."""
    bins = []
    for start in range(0, len(series), size):
        rows = series[start : start + size]
        previous = series[max(0, start - 1) : start + size - 1] if start else [rows[0], *rows[:-1]]
        outside = [
            1000 * max(0.0, row["wall_seconds"] - before["wall_seconds"] - row["train_seconds"])
            for before, row in zip(previous, rows, strict=False)
        ]
        bins.append(
            {
                "chunk": rows[-1]["chunk"],
                "outside_ms_median": round(statistics.median(outside), 1),
                "outside_ms_max": round(max(outside), 1),
                "model_age_max": max(row.get("model_age_chunks") or 0 for row in rows),
            }
        )
    return bins


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, axes = plt.subplots(3, 2, figsize=(11, 9), sharex=True)
    x = [s["chunk"] for s in samples]
    panels = [
        (axes[0][0], [(s["rss_bytes"] or float("nan")) / 2**20 for s in samples], "daemon RSS (MiB)"),
        (axes[0][1], [s["redis_used_bytes"] / 2**20 for s in samples], "Redis used memory (MiB)"),
        (axes[1][0], [s["chunk_store_bytes"] / 2**20 for s in samples], "chunk store (MiB)"),
    ]
    for ax, values, title in panels:
        ax.plot(x, values, lw=1)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    bins = result["per_bin"]
    chunk = [b["chunk"] for b in bins]
    axes[1][1].plot(chunk, [b["outside_ms_median"] for b in bins], lw=1, label="median")
    axes[1][1].plot(chunk, [b["outside_ms_max"] for b in bins], lw=0.7, label="max")
    axes[1][1].set_title(f"time per chunk outside training (ms, per {result['bin_chunks']} chunks)")
    axes[1][1].set_yscale("log")
    axes[1][1].legend(loc="upper right")
    stages = result["stages_at"]
    axes[2][0].scatter([c for c, _ in stages], [s for _, s in stages], s=3)
    axes[2][0].set_title("stage seconds")
    axes[2][0].set_ylim(bottom=0)
    axes[2][1].plot(chunk, [b["model_age_max"] for b in bins], lw=1)
    axes[2][1].axhline(result["bounds"]["max_model_age_chunks"], color="red", ls="--", lw=1, label="bound")
    axes[2][1].set_title(f"model age, oldest per {result['bin_chunks']} chunks")
    axes[2][1].set_ylim(bottom=0)
    axes[2][1].legend(loc="lower right")
    for ax in axes[2]:
        ax.set_xlabel("chunk")
    for kill in result["killed_at_chunks"]:
        for ax in axes.flat:
            ax.axvline(kill, color="grey", ls=":", lw=1)
    fig.suptitle(
        f"alma run on {result['chunks']} chunks of {result['river_stream']} (real Redis + Kafka), "
        f"killed -9 at {result['killed_at_chunks']} (dotted)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--chunk-examples", type=int, default=50)
    parser.add_argument("--river-stream", default="hyperplane")
    parser.add_argument("--max-age", type=int, default=25, help="policy.max_model_age_chunks")
    parser.add_argument(
        "--max-age-examples", type=int, default=None, help="policy.max_model_age_examples (the one default: 500)"
    )
    parser.add_argument("--replay-examples", type=int, default=2000, help="stream.replay_examples (window)")
    parser.add_argument("--max-stage-examples", type=int, default=3000, help="train.max_stage_examples")
    parser.add_argument("--buffer-bytes", type=int, default=128 << 10, help="redis.max_buffer_bytes")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--sample-seconds", type=float, default=2.0)
    parser.add_argument("--bin-chunks", type=int, default=50, help="chunks per point of the per-chunk panels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args()
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(result, args.figure)
    summary = {k: v for k, v in result.items() if k not in ("samples", "stages_at", "per_bin")}
    print(json.dumps(summary, indent=1))
    failed = [name for name, ok in result["targets"].items() if not ok]
    print("targets: " + ("all met" if not failed else f"FAILED {', '.join(failed)}"))


if __name__ == "__main__":
    main()
