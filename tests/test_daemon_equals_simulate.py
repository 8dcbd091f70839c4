"""`alma replay` + `alma run` against Tansu (Kafka) and Redis give the series `alma simulate` gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.daemon import engine_state, exact

REPO = Path(__file__).resolve().parents[1]
PROCESS_LIMIT_SECONDS = 300
STREAM_SETTINGS = {
    "dataset": {"name": "mnist", "test_examples": 300},
    "stream": {"megabatches": 4, "train_examples": 1200, "seed": 0},
    "learner": {"width": 8},
    "train": {"epochs": 2},
}


def alma(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "alma_daemon", *args], cwd=REPO, capture_output=True, timeout=PROCESS_LIMIT_SECONDS
    )
    assert done.returncode == 0, f"alma {' '.join(args)}:\n{done.stderr.decode()}"
    return done.stdout.decode()


@pytest.mark.integration
@pytest.mark.slow
def test_daemon_over_kafka_and_redis_equals_the_simulator(tmp_path, kafka_broker, redis_server, redis_db) -> None:
    topic = "alma.equality"
    service = {
        **STREAM_SETTINGS,
        "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic},
        "redis": {"url": redis_server.url},
        "daemon": {
            "state_dir": str(tmp_path / "state"),
            "checkpoint_dir": str(tmp_path / "model_store"),
            "poll_seconds": 0.2,
        },
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(service))

    alma("simulate", "--config", str(config), "--out", str(tmp_path / "simulated"), "--no-progress")
    alma(
        "replay",
        "--config",
        str(config),
        "--bootstrap-servers",
        kafka_broker.bootstrap_servers,
        "--topic",
        topic,
        "--dataset",
        "mnist",
        "--megabatches",
        "4",
        "--seed",
        "0",
        "--no-progress",
    )
    alma("run", "--config", str(config), "--until-chunks", "4", "--no-progress")

    simulated = json.loads((tmp_path / "simulated" / "results.json").read_text())["series"]
    # The committed series in Redis (daemon.stream "mnist"), not results.json, written before a step commits.
    committed = engine_state(redis_db, "mnist")["series"]
    assert len(committed) == len(simulated) == 4
    assert exact(committed) == exact(simulated)

    status = json.loads(alma("status", "--config", str(config), "--json"))
    assert status["chunks_received"] == 4 and status["chunks_trained"] == 4 and status["records_rejected"] == 0
    assert status["model_version"] == 4 and status["cer"] == pytest.approx(simulated[-1]["cumulative_error"])
