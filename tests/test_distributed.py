"""Training under torchrun (gloo, 2 processes): ensemble members spread over the ranks record exactly what
one process records; one network trained data-parallel ends near the one-process result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from alma_daemon.core.records import timeless
from alma_daemon.training.data_parallel import DataParallel
from alma_daemon.training.distributed import train_members
from alma_daemon.training.loop import FitReport
from alma_daemon.training.ranks import World, current_world
from tests.helpers.daemon import torchrun
from tests.helpers.text import TINY_LM, corpus

REPO = Path(__file__).resolve().parents[1]
PROCESS_LIMIT_SECONDS = 300
IMAGE_STREAM = {
    "dataset": {"name": "mnist", "test_examples": 200},
    "stream": {"megabatches": 3, "train_examples": 450},
    "train": {"epochs": 2, "patience": 0},
}


def simulate(config: Path, out: Path, ranks: int) -> str:
    launcher = [sys.executable, "-m", "alma_daemon"] if ranks == 1 else [*torchrun(ranks), "-m", "alma_daemon"]
    # One thread per process: multi-threaded kernels reduce in another order, and results would differ.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launcher, "simulate", "--config", str(config), "--out", str(out), "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout.decode()


def exact(results_file: Path) -> list[dict]:
    series = json.loads(results_file.read_text())["series"]
    return [timeless(r) for r in series]


def configs(tmp_path: Path) -> dict[str, dict]:
    return {
        "ens": {**IMAGE_STREAM, "learner": {"name": "ens", "width": 8, "members": 3}},
        "gens": {**IMAGE_STREAM, "learner": {"name": "gens", "width": 8, "grow_members": 3}},
        "switch-lm-ens": {
            "dataset": {"name": "text", "files": corpus(tmp_path), "vocab_size": 300},
            "stream": {"megabatches": 2, "seq_len": 16},
            "learner": {**TINY_LM, "name": "switch-lm-ens", "members": 3},
            "train": {"batch_size": 8, "steps_per_chunk": 3, "warmup_steps": 1},
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["ens", "gens", "switch-lm-ens"])
def test_members_trained_on_two_ranks_give_the_one_process_series(tmp_path, learner) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(configs(tmp_path)[learner]))
    simulate(config, tmp_path / "one", ranks=1)
    printed = simulate(config, tmp_path / "two", ranks=2)
    assert exact(tmp_path / "two" / "results.json") == exact(tmp_path / "one" / "results.json")
    assert printed.count("cumulative training FLOPs") == 1  # rank 0 alone reports


@pytest.mark.slow
def test_sm_trained_data_parallel_on_two_ranks_ends_within_half_a_point_of_one_process(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    stream = {
        "dataset": {"name": "mnist", "test_examples": 2000},
        "stream": {"megabatches": 3, "train_examples": 6000},
        "train": {"epochs": 3, "patience": 0},
        "learner": {"name": "sm", "width": 32},
    }
    config.write_text(yaml.safe_dump(stream))
    simulate(config, tmp_path / "one", ranks=1)
    printed = simulate(config, tmp_path / "two", ranks=2)
    one, two = (json.loads((tmp_path / run / "results.json").read_text()) for run in ("one", "two"))
    # Not equal bit for bit: each rank's gradient is the mean over its half of a batch and the ranks'
    # gradients are then averaged, a different order of float additions than the whole batch's mean.
    assert abs(two["summary"]["final_test_error"] - one["summary"]["final_test_error"]) <= 0.005
    assert one["summary"]["final_test_error"] < 0.3  # both learned: the comparison says something
    # The same steps on the same examples (FLOPs are linear in the rows of an MLP's batch): the two
    # ranks' FLOPs, summed, are the one process's.
    assert [r["train_flops"] for r in two["series"]] == [r["train_flops"] for r in one["series"]]
    assert [r["steps"] for r in two["series"]] == [r["steps"] for r in one["series"]]
    assert printed.count("cumulative training FLOPs") == 1  # rank 0 alone reports


@pytest.mark.slow
@pytest.mark.parametrize("learner,task", [("gmoe", "vgg"), ("firefly", "mlp"), ("switch-lm-gmoe", "tokens")])
def test_a_growing_network_trained_data_parallel_is_the_same_on_every_rank(tmp_path, learner, task) -> None:
    """Growth runs whole on every rank, training is split: after three stages (two growth steps) the
    ranks hold the same architecture and the same weights, bit for bit (vgg: BatchNorm statistics too)."""
    done = subprocess.run(
        [*torchrun(2), "-m", "tests.ranks_worker", learner, task, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    first, second = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert first["arch"] == second["arch"] and first["flops"] == second["flops"]
    assert first["flops"][2] != first["flops"][0]  # it grew: the stage's compute changed
    assert max(first["batch_rows"]) == max(second["batch_rows"]) == 16  # each rank half of a batch of 32
    assert first["state"].keys() == second["state"].keys()
    for name, tensor in first["state"].items():
        assert torch.equal(tensor, second["state"][name]), name


def test_each_rank_takes_its_slice_of_a_batch_and_the_gradient_stays_the_batch_mean() -> None:
    batch = torch.arange(7)
    parts = [DataParallel(rank, 2).take(batch) for rank in (0, 1)]
    assert [p.tolist() for p in parts if p is not None] == [[0, 1, 2, 3], [4, 5, 6]]
    # DDP averages the ranks' gradients: shares 8/7 and 6/7 weight each slice's mean by its size.
    assert sum(DataParallel(rank, 2).loss_share(4 - rank, 7) for rank in (0, 1)) == 2
    assert DataParallel(0, 2).take(torch.arange(1)) is None  # too small to split: every rank skips it
    assert DataParallel().take(batch) is batch and DataParallel().own() == ()


def test_alone_every_member_trains_here_in_the_given_order() -> None:
    assert current_world() == World(0, 1)
    trained = []

    def fit_one(index, member):
        trained.append(index)
        return FitReport(flops=10 * index, steps=1, val_error=index / 10)

    report = train_members([(3, None), (1, None), (2, None)], fit_one, seed=0)
    assert trained == [3, 1, 2]
    assert (report.flops, report.steps, report.val_error) == (60, 3, 0.3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["replay", "--embedded", "--dataset", "mnist"],
        ["grid", "grid.yaml", "--out", "runs"],
        ["ablate-iid", "--chunks", "2", "--out", "ablation.json"],
    ],
)
def test_commands_other_than_simulate_and_run_refuse_to_start_under_torchrun(tmp_path, command) -> None:
    env = {**os.environ, "WORLD_SIZE": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "alma_daemon", *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert done.returncode == 2 and b"start it without torchrun" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_simulate_and_run_under_torchrun_refuse_a_policy_that_reads_the_clock(tmp_path, command) -> None:
    env = {**os.environ, "WORLD_SIZE": "2"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "alma_daemon",
            command,
            "--set",
            "policy.name=schedule",
            "--set",
            "policy.interval_seconds=60",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert done.returncode == 2 and b"policy.name: 'schedule' decides from the clock" in done.stderr


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_under_torchrun_a_batch_smaller_than_the_ranks_is_refused_at_start_up(tmp_path, command) -> None:
    """Not at the first stage, where a daemon would fail the same step at every restart."""
    env = {**os.environ, "WORLD_SIZE": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "alma_daemon", command, "--set", "train.batch_size=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=PROCESS_LIMIT_SECONDS,
    )
    assert done.returncode == 2 and b"train.batch_size: 1 is smaller than the 2 ranks" in done.stderr
    assert not any(tmp_path.iterdir())
