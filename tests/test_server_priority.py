"""A model server starts at normal priority and takes ``serving.niceness`` once it serves: on a busy
machine its start and first load are slowed, not stalled, and afterwards it yields the cores to training.
TorchServe's workers lower their own priority once their version is loaded (serving/runtimes/torchserve_handler.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from alma_daemon.config import build_config
from alma_daemon.infra.priority import NICENESS_ENV
from alma_daemon.local_servers import torchserve
from alma_daemon.local_servers.torchserve import TorchServeServer


def nice_values(pid: int) -> list[int]:
    return [int(stat.read_text().rsplit(")", 1)[1].split()[16]) for stat in Path(f"/proc/{pid}/task").glob("*/stat")]


def test_torchserve_starts_at_normal_priority_and_tells_its_workers_the_niceness(tmp_path, monkeypatch):
    monkeypatch.setattr(torchserve, "require_torchserve", lambda: None)
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the tests may themselves run under `nice`
    config = build_config({"daemon": {"state_dir": str(tmp_path)}, "serving": {"niceness": 17}})
    server = TorchServeServer.for_config(config)
    assert "nice" not in server.command() and server.environment()[NICENESS_ENV] == "17"
    script = "import os, time; print(os.environ.get('" + NICENESS_ENV + "'), flush=True); time.sleep(60)"
    monkeypatch.setattr(server, "command", lambda: [sys.executable, "-c", script])
    server.ports = []
    seen: list[list[int]] = []

    def answers() -> bool:
        assert server.pid is not None
        seen.append(nice_values(server.pid))
        return len(seen) > 2

    monkeypatch.setattr(server, "answers_ping", answers)
    server.start()
    try:
        assert server.pid is not None and set(nice_values(server.pid)) == {own}, "lowered before a version loaded"
    finally:
        server.stop()
    assert all(set(values) == {own} for values in seen)
    assert NICENESS_ENV not in TorchServeServer(tmp_path / "plain").environment()  # niceness 0: nothing to take


def test_a_worker_lowers_its_priority_once_its_version_is_loaded() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = min(19, max(11, own + 1))
    script = (
        "import json, os, threading; from pathlib import Path\n"
        "from alma_daemon.infra.priority import lower_priority_once_loaded\n"
        "before = os.getpriority(os.PRIO_PROCESS, 0)\n"
        "threading.Thread(target=lambda: None).start()\n"
        "lower_priority_once_loaded()\n"
        "after = [int(p.read_text().rsplit(')', 1)[1].split()[16]) for p in Path('/proc/self/task').glob('*/stat')]\n"
        "print(json.dumps([before, after]))\n"
    )
    env = {**os.environ, NICENESS_ENV: str(lowered)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == own and set(after) == {lowered}
    env.pop(NICENESS_ENV)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == own and set(after) == {own}
