"""``alma dev up|status|down``: the local stack of real servers (the classes the fixtures use), detached,
found again by the pids its stack file records, and stopped by them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from alma_daemon.cli import main
from alma_daemon.commands.dev import STACK_FILE, alive
from alma_daemon.config import load_config
from alma_daemon.local_servers.processes import group_members, http_request, process_started
from tests.helpers.servers import metrics_page

ROOT = Path(__file__).resolve().parent.parent


def alma(*args: str) -> subprocess.CompletedProcess[str]:
    # From the repository root, as a user runs it: `up` reads examples/service.yaml there.
    return subprocess.run(
        [sys.executable, "-m", "alma_daemon", *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pid)


def query(prometheus: str, promql: str) -> list:
    status, body = http_request("GET", f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert status == 200, body
    return json.loads(body)["data"]["result"]


@pytest.mark.integration
@pytest.mark.slow
def test_dev_up_starts_the_stack_detached_status_sees_it_and_down_stops_it_by_pid(tmp_path, capsys) -> None:
    folder = tmp_path / "dev"
    up = alma("dev", "up", "--dir", str(folder), "--set", "stream.megabatches=20")
    assert up.returncode == 0, up.stderr
    stack = json.loads((folder / STACK_FILE).read_text())
    try:
        servers = {entry["name"]: entry for entry in stack["servers"]}
        assert list(servers) == ["redis", "kafka", "prometheus"]
        # `alma dev up` has exited; its servers run on, each its own process group.
        assert all(alive(entry) and group_members(entry["pid"]) for entry in servers.values())
        config_path = folder / "service.yaml"
        assert f"alma run --config {config_path}" in up.stdout and "alma dev down --dir" in up.stdout
        config = load_config(config_path)
        assert config.redis.url == servers["redis"]["address"]
        assert config.kafka.bootstrap_servers == servers["kafka"]["address"]
        assert f"{config.metrics.host}:{config.metrics.port}" == stack["metrics"]
        assert config.daemon.state_dir == str((folder / "daemon").resolve())
        assert (config.dataset.name, config.daemon.stream, config.stream.megabatches) == ("mnist", "mnist", 20)
        assert f"--set redis.url={config.redis.url}" in up.stdout

        import redis
        from kafka.admin import KafkaAdminClient

        with redis.Redis.from_url(config.redis.url, socket_timeout=5) as client:
            assert client.ping()
        admin = KafkaAdminClient(bootstrap_servers=config.kafka.bootstrap_servers)
        admin.list_topics()
        admin.close()

        # Prometheus scrapes the daemon's metrics port: here a stand-in for the daemon's exporter.
        with metrics_page(b"alma_cumulative_error 0.25\n", config.metrics.port):
            assert main(["dev", "status", "--dir", str(folder)]) == 0
            out = capsys.readouterr().out
            assert [line.split()[:2] for line in out.splitlines()[:4]] == [
                ["redis", "up"],
                ["kafka", "up"],
                ["prometheus", "up"],
                ["daemon", "up"],
            ]
            deadline = time.monotonic() + 30  # the first scrape comes about 5.5 s after Prometheus starts
            while not (scraped := query(servers["prometheus"]["address"], "alma_cumulative_error")):
                assert time.monotonic() < deadline, "Prometheus did not scrape the daemon's metrics port"
                time.sleep(0.25)
            assert scraped[0]["value"][1] == "0.25" and scraped[0]["metric"]["job"] == "alma"

        # `up` again while it runs is refused, and starts nothing.
        assert main(["dev", "up", "--dir", str(folder)]) == 1
        assert "already up" in capsys.readouterr().err
        assert json.loads((folder / STACK_FILE).read_text()) == stack

        # A server that died is down; status says so, with its log, and exits 1.
        os.killpg(servers["kafka"]["pid"], signal.SIGKILL)
        assert gone(servers["kafka"]["pid"])
        assert main(["dev", "status", "--dir", str(folder)]) == 1
        out = capsys.readouterr().out
        assert "kafka       down" in out and servers["kafka"]["log"] in out and "daemon      not running" in out

        down = alma("dev", "down", "--dir", str(folder))
        assert down.returncode == 0, down.stderr
        assert f"stopped redis (pid {servers['redis']['pid']})" in down.stdout
        assert f"kafka (pid {servers['kafka']['pid']}) was not running" in down.stdout
        assert f"stopped prometheus (pid {servers['prometheus']['pid']})" in down.stdout
        assert all(gone(entry["pid"]) for entry in servers.values())
        assert not (folder / STACK_FILE).exists() and (folder / "redis" / "redis.log").is_file()

        # Safe when there is nothing left to stop.
        assert main(["dev", "down", "--dir", str(folder)]) == 0
        assert "nothing to stop" in capsys.readouterr().out
        assert main(["dev", "status", "--dir", str(folder)]) == 1
    finally:
        for entry in stack["servers"]:
            if alive(entry):
                os.killpg(entry["pid"], signal.SIGKILL)


def test_down_and_status_tell_a_recorded_pid_from_a_later_process_that_reuses_it(tmp_path, capsys) -> None:
    """A pid whose process started at another time is not the stack's: never signalled."""
    me = os.getpid()
    entry = {"name": "redis", "pid": me, "started": process_started(me), "stop_signal": 15}
    assert alive(entry)
    reused = {**entry, "started": entry["started"] - 1}
    assert not alive(reused)
    stack = {
        "servers": [{**reused, "address": "redis://127.0.0.1:1/0", "port": 1, "log": "redis.log"}],
        "metrics": "127.0.0.1:1",
        "config": str(tmp_path / "service.yaml"),
    }
    (tmp_path / STACK_FILE).write_text(json.dumps(stack))
    assert main(["dev", "status", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith("redis       down")
    assert main(["dev", "down", "--dir", str(tmp_path)]) == 0  # this test's own process lives on
    assert f"redis (pid {me}) was not running" in capsys.readouterr().out
    assert not (tmp_path / STACK_FILE).exists()


def test_up_refuses_to_empty_the_folder_of_a_daemon_that_still_runs_on_it(tmp_path, capsys) -> None:
    from alma_daemon.core.checkpoints import CheckpointStore
    from alma_daemon.service.store_lock import hold_store_lock

    store = CheckpointStore(tmp_path / "daemon" / "model_store", "alma")
    (store.folder / "1").mkdir(parents=True)
    with hold_store_lock(store):  # as `alma run` holds it
        assert main(["dev", "up", "--dir", str(tmp_path)]) == 1
    assert "stop that daemon first" in capsys.readouterr().err
    assert (store.folder / "1").is_dir() and not (tmp_path / STACK_FILE).exists()


@pytest.mark.integration
@pytest.mark.slow
def test_dev_up_with_kserve_points_the_daemon_s_publisher_at_it_and_down_stops_it(tmp_path, good_and_bad) -> None:
    from serving.publishing import make_publisher
    from tests.helpers.serving import save_version

    folder = tmp_path / "dev"
    up = alma("dev", "up", "--dir", str(folder), "--serving", "kserve")
    assert up.returncode == 0, up.stderr
    stack = json.loads((folder / STACK_FILE).read_text())
    try:
        servers = {entry["name"]: entry for entry in stack["servers"]}
        assert list(servers) == ["redis", "kafka", "prometheus", "kserve"]
        config = load_config(folder / "service.yaml")
        assert (config.serving.kind, config.serving.inference_url) == ("kserve", servers["kserve"]["address"])
        # The server serves the daemon's model store: a version published there answers.
        good, _, sample = good_and_bad
        publisher = make_publisher(config)
        assert publisher is not None
        save_version(publisher.store, 1, good, sample)
        assert publisher.publish(1).action == "promoted"
        status, _ = http_request("GET", f"{servers['kserve']['address']}/v2/models/{config.serving.model_name}/ready")
        assert status == 200

        down = alma("dev", "down", "--dir", str(folder))
        assert down.returncode == 0, down.stderr
        assert f"stopped kserve (pid {servers['kserve']['pid']})" in down.stdout
        assert all(gone(entry["pid"]) for entry in servers.values())
    finally:
        for entry in stack["servers"]:
            if alive(entry):
                os.killpg(entry["pid"], signal.SIGKILL)
