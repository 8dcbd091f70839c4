"""What ``alma status`` shows, read from Redis (so it works whether the daemon runs or not), or, while
Redis is down, from the daemon's status file (``<daemon.state_dir>/daemon-status.json``). The live
(served) version comes from the serving's live pointer, ``<model store>/live.json`` (docs/serving.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from alma_daemon.config import Config
from alma_daemon.core.atomic_json import finite
from alma_daemon.core.checkpoint_index import CheckpointIndex
from alma_daemon.core.records import StepRecord
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.observability.measure_words import (
    PAPER_MEASURE,
    baseline_words,
    cumulative_words,
    higher_is_better,
    named,
    shown,
)
from alma_daemon.service.engine_store import last_record
from alma_daemon.service.redis_tx import text_hash
from serving.publishing.live_pointer import LivePointer, ServingState

#: A daemon whose heartbeat is older than this many poll intervals is reported as not running.
STALE_HEARTBEATS = 5
#: ``alma status`` says how long the daemon has been in its phase once it is at least this long.
PHASE_SECONDS_SHOWN = 3.0


def serving_state(config: Config) -> ServingState | None:
    """The live pointer of ``daemon.checkpoint_dir``'s model (None when ``serving.kind`` is none)."""
    if config.serving.kind == "none":
        return None
    return LivePointer(CheckpointIndex(config.daemon.checkpoint_dir, config.serving.model_name).folder).read()


def daemon_liveness(daemon: dict[str, Any], poll_seconds: float) -> dict[str, Any]:
    """Whether the daemon runs (a heartbeat fresher than :data:`STALE_HEARTBEATS` polls, and not
    stopped), its pid, phase (what it waits for, and for how long) and heartbeat age, from its
    heartbeat fields (Redis hash or status file)."""
    heartbeat = float(daemon["heartbeat"]) if "heartbeat" in daemon else None
    age = time.time() - heartbeat if heartbeat is not None else None
    since = float(daemon["phase_since"]) if daemon.get("phase_since") else None
    return {
        "running": age is not None
        and daemon.get("phase") != "stopped"
        and age < STALE_HEARTBEATS * max(poll_seconds, 1.0),
        "pid": int(daemon["pid"]) if daemon.get("pid") is not None else None,
        "phase": daemon.get("phase"),
        "waiting_for": daemon.get("waiting_for") or None,
        "phase_seconds": round(time.time() - since, 3) if since is not None else None,
        "heartbeat_age_seconds": round(age, 3) if age is not None else None,
    }


def phase_words(daemon: dict[str, Any]) -> str:
    """``waiting for the swap of version 12, 40 s``: the phase, what it waits for and for how long."""
    phase: str = daemon["phase"]
    if phase == "waiting" and daemon.get("waiting_for"):
        phase = f"waiting for {daemon['waiting_for']}"
    seconds = daemon.get("phase_seconds")
    # A phase of a few seconds is a step among others; longer, it is a wait a person asks about.
    if seconds is not None and seconds >= PHASE_SECONDS_SHOWN and phase not in ("stopped", "stopping"):
        phase += f", {seconds:.0f} s"
    return phase


def engine_counters(client: Any, keys: StreamKeys) -> dict[str, Any]:
    """The committed engine state's counters (``chunks_seen``, ``model_version``...), without its series."""
    raw = client.get(keys.engine)
    return json.loads(raw) if raw is not None else {}


def freshness_bound(config: Config) -> dict[str, Any]:
    """``policy.max_model_age_chunks``, ``_examples`` and ``_seconds`` as ``{chunks, examples, seconds}`` (None:
    unset)."""
    policy = config.policy
    return {
        "chunks": policy.max_model_age_chunks,
        "examples": policy.max_model_age_examples,
        "seconds": policy.max_model_age_seconds,
    }


def model_age(engine: dict[str, Any], now: float) -> tuple[int | None, float | None]:
    """Chunks arrived and seconds passed since the last stage (since the stream's start before the first),
    as Engine.model_age counts them, from the committed engine state; None where it does not say (no
    chunk yet, or a state written before the model's age was kept)."""
    if "last_stage_chunks_seen" not in engine:
        return None, None
    since = engine.get("last_stage_at") or engine.get("started_at")
    seconds = round(max(0.0, now - float(since)), 3) if since is not None else None
    return int(engine.get("chunks_seen", 0)) - int(engine["last_stage_chunks_seen"]), seconds


def prequential_window(engine: dict[str, Any], last: StepRecord | None) -> dict[str, Any] | None:
    """The latest windowed prequential measure (``mean``) and the chunks it is the mean of (``chunks``:
    up to ``stream.prequential_window``); None before the first chunk and in rows written before it was kept."""
    if last is None or last.prequential_window is None:
        return None
    return finite({"chunks": len(engine.get("recent_prequential", [])), "mean": last.prequential_window})


def reference_window(engine: dict[str, Any], last: StepRecord | None) -> dict[str, Any] | None:
    """The reference learner's windowed prequential measure beside the network's, over the same chunks
    (``reference.kind``, core/reference.py): ``mean``, ``network`` (the network's), ``chunks`` and
    ``behind`` (the network's is worse); None without a reference, or before its first chunk."""
    if last is None or last.reference_window is None or last.prequential_window is None:
        return None
    reference, network = last.reference_window, last.prequential_window
    behind = network < reference if higher_is_better(last.measure) else network > reference
    return finite(
        {"chunks": len(engine.get("recent_reference", [])), "mean": reference, "network": network, "behind": behind}
    )


def read_status(
    client: Any,
    keys: StreamKeys,
    poll_seconds: float = 1.0,
    serving: ServingState | None = None,
    bound: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Counters, buffer sizes, the engine's progress and the daemon's heartbeat, as plain data;
    ``serving`` (from :func:`serving_state`) adds the live version, ``bound`` (from
    :func:`freshness_bound`) the freshness bound the model's age is held to, where the daemon has not
    recorded the one it runs by."""
    ingest = text_hash(client, keys.ingest)
    daemon = text_hash(client, keys.daemon)
    engine = engine_counters(client, keys)
    last_row = last_record(client, keys)
    last = StepRecord.from_row(last_row) if last_row is not None else None
    counts = {
        name: int(client.zcard(key))
        for name, key in (
            ("ready", keys.ready),
            ("assembling", keys.assembling),
            ("pending", keys.pending),
            ("kept", keys.kept),
        )
    }
    chunks_processed = int(engine.get("chunks_seen", 0))
    last_taken = int(engine.get("last_chunk", 0))
    lowest_ready = client.zrange(keys.ready, 0, 0)
    # The ready chunks the engine holds back behind a missing id (service/reorder.py).
    waiting_on_gap = counts["ready"] if last_taken and lowest_ready and int(lowest_ready[0]) > last_taken + 1 else 0
    model_version = int(engine.get("model_version", 0))
    age_chunks, age_seconds = model_age(engine, time.time())
    return {
        "stream": keys.stream,
        "daemon": {
            **daemon_liveness(daemon, poll_seconds),
            "rss_bytes": int(daemon["rss_bytes"]) if "rss_bytes" in daemon else None,
            "ingest": daemon.get("ingest"),
            "healthy": daemon.get("healthy") == "1" if "healthy" in daemon else None,
            **degradation(daemon),
        },
        "chunks_received": int(ingest.get("chunks_received", 0)),
        "examples_received": int(ingest.get("examples_received", 0)),
        "chunks_assembling": counts["assembling"],
        "chunks_ready": counts["ready"],
        "chunks_buffered": counts["ready"] + counts["pending"] + counts["kept"],
        "chunks_pending": counts["pending"],
        "chunks_processed": chunks_processed,
        "chunks_trained": chunks_processed - counts["pending"],
        "chunks_waiting_on_gap": waiting_on_gap,
        "chunks_late": int(engine.get("late_chunks", 0)),
        "queued_bytes": int(ingest.get("queued_bytes", 0)),
        "records_rejected": int(ingest.get("records_rejected", 0)),
        "rejected_by_reason": {
            k.removeprefix("rejected:"): int(v) for k, v in ingest.items() if k.startswith("rejected:")
        },
        "stages": int(engine.get("stages_done", 0)),
        "model_version": model_version,
        "live_version": serving.live if serving is not None else None,
        "live_state": live_state(model_version, serving),
        "last_decision": engine.get("last_decision") or None,
        "cer": last.cumulative if last and last.measure == PAPER_MEASURE else None,
        "last_test_error": last.measured("error") if last else None,
        "last_test_perplexity": last.measured("perplexity") if last else None,
        "measure": measure_status(last) if last else None,
        "prequential_window": prequential_window(engine, last),
        "reference": reference_window(engine, last),
        "model_age_chunks": age_chunks,
        "model_age_seconds": age_seconds,
        # The bound the daemon runs by, as it recorded it at its start; else the config's.
        "freshness_bound": json.loads(daemon["freshness_bound"])
        if daemon.get("freshness_bound")
        else bound or {"chunks": None, "seconds": None},
        "cumulative_train_flops": int(engine.get("cumulative_train_flops", 0)),
        "offsets": text_hash(client, keys.offsets),
    }


def live_state(model_version: int, serving: ServingState | None) -> str | None:
    """How the live version stands to the newest one (None without serving).

    ``newest``: the newest version is live; ``none``: nothing is live yet; ``rolled_back``: ``alma
    rollback`` made an older version live (a promotion never does: it makes ``previous`` older than
    ``live``); ``publishing``: the publisher has not yet ruled on the newest version (the daemon is
    at it, retrying, or catches up at its next start); ``not_promoted``: newer versions were refused by
    the promotion guard, or rolled back from and ``alma rollback`` was used again since; ``foreign``:
    the live version is newer than any of this stream's, so the model store serves another stream
    (two deployments sharing ``daemon.checkpoint_dir``).
    """
    if serving is None:
        return None
    live = serving.live
    if live is None:
        return "none"
    if live == model_version:
        return "newest"
    if live > model_version:
        return "foreign"
    if serving.previous is not None and serving.previous > live:
        return "rolled_back"
    if serving.decided < model_version:
        return "publishing"
    return "not_promoted"


#: How ``alma status`` words each :func:`live_state` after ``live: V``.
LIVE_STATE_WORDS = {
    "rolled_back": "rolled back",
    "publishing": "newer not published yet",
    "not_promoted": "newer refused by the promotion guard or rolled back",
    "foreign": "newer than this stream's: daemon.checkpoint_dir serves another stream",
}


def model_row(status: dict[str, Any]) -> tuple[str, str]:
    """``model version  10 (live: 8, rolled back)``: the newest version and the one served."""
    version, state = status["model_version"], status.get("live_state")
    if state is None:
        return "model version", str(version)
    if state == "newest":
        return "model version", f"{version} (live)"
    if state == "none":
        return "model version", f"{version} (none live yet)"
    return "model version", f"{version} (live: {status['live_version']}, {LIVE_STATE_WORDS[state]})"


def duration_words(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3 h``, ``2.5 d``: a model's age or bound at a glance."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    value, unit = (seconds / 3600, "h") if seconds < 48 * 3600 else (seconds / 86400, "d")
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def model_age_row(status: dict[str, Any]) -> tuple[str, str]:
    """``model age  12 chunk(s), 3 h since the last stage (bound: 50 chunks, 24 h)``: how old the model is,
    and the freshness bound that forces a stage (``policy.max_model_age_*``), with ``passed`` once it is."""
    chunks, seconds = status.get("model_age_chunks"), status.get("model_age_seconds")
    if chunks is None or seconds is None:
        return "model age", "n/a (no chunk yet)" if not status.get("chunks_processed") else "n/a (not recorded)"
    since = "since the last stage" if status.get("stages") else "since the stream started (no stage yet)"
    bound = status.get("freshness_bound") or {}
    limits = [f"{bound['chunks']} chunks"] if bound.get("chunks") is not None else []
    # The bound in examples forces its stage on the chunk that reaches it: a status never finds it passed.
    limits += [f"{bound['examples']} examples"] if bound.get("examples") is not None else []
    limits += [duration_words(bound["seconds"])] if bound.get("seconds") is not None else []
    passed = (bound.get("chunks") is not None and chunks >= bound["chunks"]) or (
        bound.get("seconds") is not None and seconds >= bound["seconds"]
    )
    verdict = ""
    if passed:
        # Past the bound a stage is forced as soon as a chunk arrived since the last one; none, there is
        # nothing to train on.
        verdict = ": passed, a stage is due" if chunks else ": passed, no chunk waits"
    limit = f"bound: {', '.join(limits)}{verdict}" if limits else "no bound"
    return "model age", f"{chunks} chunk(s), {duration_words(seconds)} {since} ({limit})"


def degradation(daemon: dict[str, Any]) -> dict[str, Any]:
    """The daemon's outages as it last reported them (``degraded``, ``degraded_since``, ``outages``)."""
    reported = json.loads(daemon["degraded"]) if daemon.get("degraded") else {}
    return {
        "degraded": bool(reported.get("degraded")),
        "degraded_since": reported.get("degraded_since"),
        "outages": reported.get("outages", []),
    }


def local_status(
    path: Path, redis_error: str, poll_seconds: float, serving: ServingState | None = None
) -> dict[str, Any]:
    """What ``alma status`` can tell while Redis is down: the daemon's own status file, and the live
    version from the serving's pointer (the newest version is known to Redis only)."""
    daemon = json.loads(path.read_text()) if path.is_file() else {}
    return {
        "redis_unreachable": redis_error,
        "status_file": str(path),
        "live_version": serving.live if serving is not None else None,
        "serving": serving is not None,
        "daemon": {**daemon_liveness(daemon, poll_seconds), **degradation(daemon)},
    }


def format_local_status(status: dict[str, Any]) -> str:
    daemon = status["daemon"]
    rows = [("redis", f"unreachable: {status['redis_unreachable']}")]
    if daemon["phase"] is None:
        rows.append(("daemon", f"unknown (no {status['status_file']})"))
    else:
        state = "running" if daemon["running"] else "not running"
        rows.append(
            (
                "daemon",
                f"{state} ({phase_words(daemon)}, pid {daemon['pid']}, heartbeat "
                f"{daemon['heartbeat_age_seconds']:.0f} s ago, from {status['status_file']})",
            )
        )
        rows.append(degraded_row(daemon))
    if status["serving"]:
        live = status["live_version"]
        rows.append(("live version", str(live) if live is not None else "none live yet"))
    return _aligned(rows)


def _aligned(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def degraded_row(daemon: dict[str, Any]) -> tuple[str, str]:
    if not daemon.get("degraded"):
        return "degraded", "no"
    since = daemon["degraded_since"]
    why = "; ".join(f"{_server_words(o)}: {o['reason']}" for o in daemon["outages"])
    return "degraded", (
        f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))} ({time.time() - since:.0f} s): {why}"
    )


def _server_words(outage: dict[str, Any]) -> str:
    """``kafka at 127.0.0.1:9092`` (a status file written before addresses were kept: ``kafka``)."""
    return f"{outage['server']} at {outage['address']}" if outage.get("address") else outage["server"]


def format_status(status: dict[str, Any]) -> str:
    """A few human-readable lines."""
    daemon = status["daemon"]
    state = "running" if daemon["running"] else "not running"
    if daemon["phase"]:
        state += f" ({phase_words(daemon)}, pid {daemon['pid']})"
    decision = status["last_decision"] or {}
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(status["rejected_by_reason"].items())) or "none"
    rows = [
        ("stream", status["stream"]),
        ("daemon", state),
        degraded_row(daemon),
        ("chunks received", f"{status['chunks_received']} ({status['examples_received']} examples)"),
        (
            "chunks buffered",
            f"{status['chunks_buffered']} (ready {status['chunks_ready']}, pending "
            f"{status['chunks_pending']}, assembling {status['chunks_assembling']})",
        ),
        (
            "chunks trained",
            f"{status['chunks_trained']} of {status['chunks_processed']} processed, {status['stages']} stage(s)",
        ),
        (
            "out of order",
            f"{status['chunks_waiting_on_gap']} waiting on a missing id, {status['chunks_late']} taken late",
        ),
        ("last decision", f"{decision.get('action')}: {decision.get('reason')}" if decision else "none yet"),
        model_row(status),
        model_age_row(status),
        *measure_rows(status),
        ("records rejected", f"{status['records_rejected']} ({rejected})"),
    ]
    return _aligned(rows)


def measure_status(last: StepRecord) -> dict[str, Any]:
    """The task's measure after the latest chunk: its name and direction, the test and prequential
    values, their running sums (the CER of the error rate), the input-blind baseline and the other
    measures (``details``, of the test set, else of the chunk: ``details_on``). NaN reads as None."""
    details_on = "test" if last.test_measures else "prequential"
    return finite(
        {
            "name": last.measure,
            "higher_is_better": higher_is_better(last.measure),
            "test": last.test,
            "prequential": last.prequential,
            "cumulative": last.cumulative,
            "cumulative_prequential": last.cumulative_prequential,
            "baseline": last.baseline,
            "details": (last.test_measures or last.prequential_measures or {}),
            "details_on": details_on,
        }
    )


#: What ``alma status`` says of a measure not taken.
NOT_MEASURED = "n/a (no test set or no chunk yet)"


def measure_rows(status: dict[str, Any]) -> list[tuple[str, str]]:
    """The task's measure: its latest test and prequential values and the mean of the last chunks'
    (``stream.prequential_window``), its running sum (a classifier's CER), the input-blind baseline, the
    reference learner's mean over the same chunks (and whether the network is behind it) and the other
    measures; a language model's latest test perplexity."""
    measure = status.get("measure")
    if measure is None:
        return [("CER so far", NOT_MEASURED)]
    m, test, prequential = measure["name"], measure["test"], measure["prequential"]
    window = status.get("prequential_window")
    if m == "perplexity":
        latest = f"{test:.2f}" if test is not None else "n/a (no test set)"
        lately = f", last {window['chunks']} chunks {window['mean']:.2f}" if window else ""
        return [("test perplexity", f"{latest} (prequential {prequential:.2f}{lately})")]
    cumulative = measure["cumulative"]
    lately = f", last {window['chunks']} chunks {_or_na(m, window['mean'])}" if window else ""
    rows = [
        ("measure", f"{named(m)}: test {_or_na(m, test)}, prequential {_or_na(m, prequential)}{lately}"),
        (f"{cumulative_words(m)} so far", shown(m, cumulative) if cumulative is not None else NOT_MEASURED),
    ]
    if measure["baseline"] is not None:
        rows.append((baseline_words(m), shown(m, measure["baseline"])))
    reference = status.get("reference")
    if reference:
        verdict = "behind the reference" if reference["behind"] else "not behind the reference"
        rows.append(
            (
                "reference (linear)",
                f"last {reference['chunks']} chunks {_or_na(m, reference['mean'])}, the network's "
                f"{_or_na(m, reference['network'])}: {verdict}",
            )
        )
    if measure["details"]:
        on = "test set" if measure["details_on"] == "test" else "latest chunk"
        values = ", ".join(f"{name} {_or_na(m, value)}" for name, value in measure["details"].items())
        rows.append(("other measures", f"{values} ({on})"))
    return rows


def _or_na(measure: str, value: float | None) -> str:
    return shown(measure, value) if value is not None else "n/a"
