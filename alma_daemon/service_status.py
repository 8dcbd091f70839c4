"""What ``alma status`` shows, read from Redis alone (so it works whether the daemon runs or not)."""

from __future__ import annotations

import json
import time
from typing import Any

from alma_daemon.engine_store import last_record
from alma_daemon.redis_keys import StreamKeys

#: A daemon whose heartbeat is older than this many poll intervals is reported as not running.
STALE_HEARTBEATS = 5


def read_status(client: Any, keys: StreamKeys, poll_seconds: float = 1.0) -> dict:
    """Counters, buffer sizes, the engine's progress and the daemon's heartbeat, as plain data."""
    ingest = {k.decode(): v.decode() for k, v in client.hgetall(keys.ingest).items()}
    daemon = {k.decode(): v.decode() for k, v in client.hgetall(keys.daemon).items()}
    raw_engine = client.get(keys.engine)
    engine = json.loads(raw_engine) if raw_engine is not None else {}
    last = last_record(client, keys) or {}
    counts = {name: int(client.zcard(key)) for name, key in (
        ("ready", keys.ready), ("assembling", keys.assembling), ("pending", keys.pending), ("kept", keys.kept))}
    heartbeat = float(daemon["heartbeat"]) if "heartbeat" in daemon else None
    running = (heartbeat is not None and daemon.get("phase") != "stopped"
               and time.time() - heartbeat < STALE_HEARTBEATS * max(poll_seconds, 1.0))
    chunks_processed = int(engine.get("chunks_seen", 0))
    return {
        "stream": keys.stream,
        "daemon": {
            "running": running,
            "pid": int(daemon["pid"]) if "pid" in daemon else None,
            "phase": daemon.get("phase"),
            "heartbeat_age_seconds": round(time.time() - heartbeat, 3) if heartbeat is not None else None,
            "rss_bytes": int(daemon["rss_bytes"]) if "rss_bytes" in daemon else None,
            "ingest": daemon.get("ingest"),
            "healthy": daemon.get("healthy") == "1" if "healthy" in daemon else None,
        },
        "chunks_received": int(ingest.get("chunks_received", 0)),
        "examples_received": int(ingest.get("examples_received", 0)),
        "chunks_assembling": counts["assembling"],
        "chunks_ready": counts["ready"],
        "chunks_buffered": counts["ready"] + counts["pending"] + counts["kept"],
        "chunks_pending": counts["pending"],
        "chunks_processed": chunks_processed,
        "chunks_trained": chunks_processed - counts["pending"],
        "queued_bytes": int(ingest.get("queued_bytes", 0)),
        "records_rejected": int(ingest.get("records_rejected", 0)),
        "rejected_by_reason": {k.removeprefix("rejected:"): int(v) for k, v in ingest.items()
                               if k.startswith("rejected:")},
        "stages": int(engine.get("stages_done", 0)),
        "model_version": int(engine.get("model_version", 0)),
        "last_decision": engine.get("last_decision") or None,
        "cer": last.get("cumulative_error"),
        "last_test_error": last.get("test_error"),
        "last_test_perplexity": last.get("test_perplexity"),
        "cumulative_train_flops": int(engine.get("cumulative_train_flops", 0)),
        "offsets": {k.decode(): v.decode() for k, v in client.hgetall(keys.offsets).items()},
    }


def format_status(status: dict) -> str:
    """A few human-readable lines."""
    daemon = status["daemon"]
    state = "running" if daemon["running"] else "not running"
    if daemon["phase"]:
        state += f" ({daemon['phase']}, pid {daemon['pid']})"
    decision = status["last_decision"] or {}
    cer = status["cer"]
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(status["rejected_by_reason"].items())) or "none"
    rows = [
        ("stream", status["stream"]),
        ("daemon", state),
        ("chunks received", f"{status['chunks_received']} ({status['examples_received']} examples)"),
        ("chunks buffered", f"{status['chunks_buffered']} (ready {status['chunks_ready']}, pending "
                            f"{status['chunks_pending']}, assembling {status['chunks_assembling']})"),
        ("chunks trained", f"{status['chunks_trained']} of {status['chunks_processed']} processed, "
                           f"{status['stages']} stage(s)"),
        ("last decision", f"{decision.get('action')}: {decision.get('reason')}" if decision else "none yet"),
        ("model version", str(status["model_version"])),
        measure_row(cer, status["last_test_perplexity"]),
        ("records rejected", f"{status['records_rejected']} ({rejected})"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def measure_row(cer: float | None, perplexity: float | None) -> tuple[str, str]:
    """A classifier's running CER, or a language model's latest test perplexity."""
    if perplexity is not None:
        return "test perplexity", f"{perplexity:.2f}"
    return "CER so far", f"{cer:.4f}" if cer is not None else "n/a (no test set or no chunk yet)"
