"""Daemon configs, in-process runs with crashes, and ``alma`` subprocesses with their limits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from alma_daemon.config import Config
from alma_daemon.core.engine import EngineObserver
from alma_daemon.core.records import StepRecord, timeless
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.daemon import Daemon
from alma_daemon.service.engine_store import EngineStateStore, state_fields

#: The repository root: the working directory of `alma` subprocesses.
REPO = Path(__file__).resolve().parents[2]


#: Generous limits for a loaded 2-core machine; they bound a hang, they do not measure anything.
PROCESS_LIMIT_SECONDS = 300


def service_config(tmp_path: Path, redis_url: str | None, name: str, **sections) -> dict:
    data = {
        "dataset": {"name": "mnist", "test_examples": 200},
        "stream": {"megabatches": 4, "train_examples": 600},
        "learner": {"width": 8},
        "train": {"epochs": 1, "patience": 0},
        "kafka": {"transport": "redis", "topic": f"alma.{name}"},
        "redis": {"url": redis_url},
        "daemon": {
            "stream": name,
            "state_dir": str(tmp_path / name / "state"),
            "checkpoint_dir": str(tmp_path / name / "model_store"),
            "poll_seconds": 0.2,
        },
    }
    for section, values in sections.items():
        if section == "learner" and "name" in values:
            # Another learner reads other keys: the MLP's width would be refused as foreign to it.
            data[section] = dict(values)
        else:
            data.setdefault(section, {}).update(values)
    return data


def exact(series: list[dict]) -> list[dict]:
    return [timeless(r) for r in series]


def engine_state(client, stream: str) -> dict:
    state = EngineStateStore(client, StreamKeys(stream)).load()
    return state_fields(state) | {"series": state.series} if state is not None else {}


class Crash(BaseException):
    """Stands for the process dying at the point the observer is called."""


class CrashOnce(EngineObserver):
    def __init__(self, hook: str, at: int):
        self.hook, self.at = hook, at

    def on_checkpoint(self, version: int, path: str, metrics: dict, engine) -> None:
        if self.hook == "checkpoint" and version == self.at:
            raise Crash(f"after checkpoint {version} was written, before the step was committed")

    def on_step(self, record: StepRecord, engine) -> None:
        if self.hook == "step" and record.chunk == self.at:
            raise Crash(f"after results of chunk {self.at} were written, before the step was committed")


def run_daemon(config: Config, client, until: int, observers=()) -> Daemon:
    daemon = Daemon(config, client, until_chunks=until, observers=list(observers))
    daemon.run()
    return daemon


def write_config(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['daemon']['stream']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start_daemon(config_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "alma_daemon", "run", "--config", str(config_path), "--no-progress", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_until(condition, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + PROCESS_LIMIT_SECONDS
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"daemon exited with {process.returncode} before {what}:\n{process.stdout.read().decode()}")
        assert time.monotonic() < deadline, f"not {what} within {PROCESS_LIMIT_SECONDS} s"
        time.sleep(0.05)


def sigkill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=PROCESS_LIMIT_SECONDS)
    assert process.returncode == 0, output.decode()
    return output.decode()


def torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
