"""``alma run`` and ``alma status`` through the command line, on the embedded Redis: what is refused at
start (a second daemon on the stream, an ``--until-chunks`` the replay never reaches), the progress of
a resumed run, and the live version after a rollback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alma_daemon.data.datasets import resolve_data_root
from alma_daemon.infra.unreachable import unreachable_line
from alma_daemon.service.status import live_state, model_row
from serving.publishing.live_pointer import ServingState
from tests.helpers.daemon import PROCESS_LIMIT_SECONDS, REPO, sigkill, wait_until
from tests.helpers.servers import free_port

#: The commands replay MNIST (`alma run --replay mnist`), which is read from the data folder and never
#: downloaded: where a user's checkout has no MNIST files those tests cannot run (CI has them, from
#: ../shared/data). The pure-logic tests at the end run everywhere.
needs_mnist = pytest.mark.skipif(
    not (resolve_data_root(None) / "mnist").is_dir(), reason="MNIST files not in the data folder (see README: data)"
)

#: Three chunks of 100 MNIST examples: seconds per run.
STREAM = {
    "stream.megabatches": 3,
    "stream.train_examples": 300,
    "learner.width": 4,
    "train.epochs": 1,
    "dataset.test_examples": 100,
}


def settings(root: Path) -> list[str]:
    values = {**STREAM, "daemon.state_dir": root / "state", "daemon.checkpoint_dir": root / "ms"}
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def alma(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "alma_daemon", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )


def status(root: Path) -> dict:
    result = alma("status", "--embedded", "--json", *settings(root))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.integration
@pytest.mark.slow
@needs_mnist
def test_a_second_daemon_on_the_stream_is_refused_at_start_and_a_restart_after_kill_9_is_not(tmp_path) -> None:
    # No --until-chunks: the first daemon keeps running once the replay is done.
    first = subprocess.Popen(
        [sys.executable, "-m", "alma_daemon", "run", "--embedded", "--replay", "mnist", "--no-progress"]
        + settings(tmp_path),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: (tmp_path / "state" / "results.json").is_file(), "a chunk processed", first)
        second = alma(
            "run", "--embedded", "--replay", "mnist", "--until-chunks", "3", "--no-progress", *settings(tmp_path)
        )
        assert first.poll() is None
    finally:
        sigkill(first)
    assert second.returncode == 1
    assert second.stderr.splitlines()[-1] == (
        f"alma run: error: another daemon (pid {first.pid}) is already running on model store "
        f"{tmp_path / 'ms' / 'alma'} (one daemon per stream)"
    )
    # The lock died with the first daemon; its file, with the dead pid in it, blocks nothing.
    assert (tmp_path / "ms" / "alma" / ".daemon.lock").read_text().strip() == str(first.pid)
    third = alma("run", "--embedded", "--replay", "mnist", "--until-chunks", "3", "--no-progress", *settings(tmp_path))
    assert third.returncode == 0, third.stderr
    assert status(tmp_path)["chunks_trained"] == 3


@pytest.mark.slow
@needs_mnist
def test_until_chunks_beyond_what_the_replay_sends_is_refused_at_start(tmp_path) -> None:
    result = alma("run", "--embedded", "--replay", "mnist", "--until-chunks", "5", "--no-progress", *settings(tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "alma run: config error: --until-chunks 5 is more than the 3 chunks --replay mnist sends "
        "(stream.megabatches=3): the daemon would wait for chunk 4 forever"
    ]
    assert not (tmp_path / "state").exists(), "something started before the refusal"


@pytest.mark.slow
@needs_mnist
def test_replay_into_an_event_stream_is_refused_at_start_naming_the_key_and_the_way(tmp_path) -> None:
    result = alma(
        "run",
        "--embedded",
        "--replay",
        "mnist",
        "--set",
        "stream.chunk_seconds=5",
        "--no-progress",
        *settings(tmp_path),
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "alma run: config error: stream.chunk_seconds: set, so the stream takes labeled events, but --replay sends "
        "chunk parts; run without --replay and feed it with `alma replay --events` in another shell"
    ]
    assert not (tmp_path / "state").exists(), "something started before the refusal"


@pytest.mark.integration
@pytest.mark.slow
@needs_mnist
def test_a_replay_that_fails_is_told_in_one_line_without_a_traceback(tmp_path) -> None:
    port = free_port()  # nobody listens: no broker
    run = alma("run", "--replay", "mnist", "--set", f"kafka.bootstrap_servers=127.0.0.1:{port}", *settings(tmp_path))
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.rstrip().splitlines()[-1] == (
        f"alma run: replay failed: {unreachable_line('kafka', f'127.0.0.1:{port}', 'connection refused')}"
    )


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A stream of 3 chunks run to chunk 2, then resumed to chunk 3 with its progress bar shown."""
    root = tmp_path_factory.mktemp("resumed")
    first = alma("run", "--embedded", "--replay", "mnist", "--until-chunks", "2", "--no-progress", *settings(root))
    assert first.returncode == 0, first.stderr
    second = alma("run", "--embedded", "--replay", "mnist", "--until-chunks", "3", *settings(root))
    assert second.returncode == 0, second.stderr
    return root, second


@pytest.mark.integration
@pytest.mark.slow
@needs_mnist
def test_the_progress_bar_of_a_resumed_run_counts_the_chunks_processed_before(resumed) -> None:
    _, run = resumed
    bars = [line for line in re.split(r"[\r\n]", run.stderr) if re.search(r"\d+/3 ", line)]
    assert "2/3 " in bars[0] and "100%" in bars[-1] and "3/3 " in bars[-1], bars


@pytest.mark.integration
@pytest.mark.slow
@needs_mnist
def test_status_shows_the_live_version_and_a_rollback(resumed) -> None:
    root, run = resumed
    assert re.search(r"^model version +3 \(live\)$", run.stdout, re.M), run.stdout
    before = status(root)
    assert (before["model_version"], before["live_version"], before["live_state"]) == (3, 3, "newest")

    rollback = alma("rollback", "--to", "1", *settings(root))
    assert rollback.returncode == 0, rollback.stderr
    after = status(root)
    assert (after["model_version"], after["live_version"], after["live_state"]) == (3, 1, "rolled_back")
    shown = alma("status", "--embedded", *settings(root)).stdout
    assert re.search(r"^model version +3 \(live: 1, rolled back\)$", shown, re.M), shown
    # JSON keeps the CER's full precision; the table rounds it.
    assert re.search(rf"^CER so far +{after['cer']:.4f}$", shown, re.M), shown


@pytest.mark.integration
@pytest.mark.slow
@needs_mnist
def test_status_while_redis_is_down_shows_the_daemon_file_and_the_live_version(resumed) -> None:
    root, _ = resumed
    live = status(root)["live_version"]
    nobody_listens = f"redis.url=redis://127.0.0.1:{free_port()}/0"
    shown = alma("status", "--set", nobody_listens, *settings(root))
    assert shown.returncode == 1, shown.stderr
    assert re.search(r"^redis +unreachable: ", shown.stdout, re.M), shown.stdout
    assert re.search(r"^daemon +not running \(stopped, ", shown.stdout, re.M), shown.stdout
    assert re.search(rf"^live version +{live}$", shown.stdout, re.M), shown.stdout


@pytest.mark.parametrize(
    ("serving", "state", "shown"),
    [
        (None, None, "7"),
        (ServingState(), "none", "7 (none live yet)"),
        (ServingState(live=7, decided=7, previous=6), "newest", "7 (live)"),
        (ServingState(live=5, decided=7, previous=7), "rolled_back", "7 (live: 5, rolled back)"),
        (ServingState(live=6, decided=6, previous=5), "publishing", "7 (live: 6, newer not published yet)"),
        (
            ServingState(live=6, decided=7, previous=5),
            "not_promoted",
            "7 (live: 6, newer refused by the promotion guard or rolled back)",
        ),
        (
            ServingState(live=10, decided=10, previous=9),
            "foreign",
            "7 (live: 10, newer than this stream's: daemon.checkpoint_dir serves another stream)",
        ),
    ],
)
def test_the_live_version_is_told_against_the_newest_one(serving, state, shown) -> None:
    assert live_state(7, serving) == state
    live = serving.live if serving is not None else None
    assert model_row({"model_version": 7, "live_version": live, "live_state": state}) == ("model version", shown)
