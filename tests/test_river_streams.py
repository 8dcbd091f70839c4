"""River's streams as chunk streams (``dataset.name: river``): deterministic, well-formed, drifting
where declared, read without the network, and replayed alike by every front door."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import typing

import pytest
import torch

from alma_daemon.config import DatasetConfig, build_config, load_config
from alma_daemon.data.datasets import DatasetError
from alma_daemon.data.river_streams import RIVER_STREAMS, read_river
from alma_daemon.data.stream_task import load_stream_task
from alma_daemon.research.simulate import run_simulation, simulated_stream
from alma_daemon.transports.replay import chunk_source
from tests.helpers.daemon import PROCESS_LIMIT_SECONDS, REPO, exact

# CI installs the river extra (scripts/setup.sh), so these run there; elsewhere they say why they skip.
pytest.importorskip("river", reason="River is not installed: pip install -e '.[river]'")


def river_config(stream: str = "agrawal", examples: int = 600, **sections: dict) -> typing.Any:
    return build_config(
        {
            "dataset": {"name": "river", "river_stream": stream, "river_examples": examples},
            "stream": {"megabatches": 3, "seed": 0},
            **sections,
        }
    )


def test_the_river_example_config_is_valid():
    config = load_config(REPO / "examples" / "custom" / "river-agrawal.yaml")
    assert (config.dataset.name, config.dataset.river_stream, config.policy.name) == ("river", "agrawal", "adaptive")


def test_the_regression_example_config_is_valid():
    config = load_config(REPO / "examples" / "river-friedman.yaml")
    assert (config.dataset.river_stream, config.task.kind, config.task.measure) == ("friedman", "regression", "mse")


def test_the_config_offers_exactly_the_registered_streams():
    annotation = typing.get_type_hints(DatasetConfig)["river_stream"]
    assert list(typing.get_args(annotation)) == list(RIVER_STREAMS)


CLASSIFIERS = [name for name, stream in RIVER_STREAMS.items() if not stream.regression]
REGRESSIONS = [name for name, stream in RIVER_STREAMS.items() if stream.regression]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_stream_is_float32_features_and_labels_of_its_classes(name):
    river = read_river(name, 300, seed=0)
    stream = RIVER_STREAMS[name]
    features = len(river.task.extra["features"])
    assert (len(river.train), len(river.test)) == (270, 30)
    assert river.task.input_shape == (features,) and river.task.kind == "classification"
    assert river.task.num_classes == len(stream.classes)
    assert river.task.normalization == "standardize"
    for data in (river.train, river.test):
        assert data.x.dtype == torch.float32 and data.x.shape[1:] == (features,)
        assert data.y.dtype == torch.int64
        assert 0 <= int(data.y.min()) and int(data.y.max()) < river.task.num_classes
        assert bool(torch.isfinite(data.x).all())


@pytest.mark.parametrize("name", REGRESSIONS)
def test_a_regression_stream_is_float32_features_and_float32_targets(name):
    river = read_river(name, 300, seed=0)
    assert (river.task.kind, river.task.num_classes, river.task.input_shape) == ("regression", 1, (10,))
    assert river.task.awaits_target_statistics
    for data in (river.train, river.test):
        assert data.x.dtype == torch.float32 and data.y.dtype == torch.float32
        assert bool(torch.isfinite(data.y).all()) and float(data.y.std()) > 1


def _friedman_1(x: torch.Tensor) -> torch.Tensor:
    """Friedman's function 1 (River's ``Friedman`` before its noise)."""
    return 10 * torch.sin(math.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]


def _friedman_swapped(x: torch.Tensor) -> torch.Tensor:
    """FriedmanDrift's global drift: the relevant features swap places."""
    return 10 * torch.sin(math.pi * x[:, 3] * x[:, 5]) + 20 * (x[:, 1] - 0.5) ** 2 + 10 * x[:, 0] + 5 * x[:, 2]


def test_friedman_drift_swaps_its_features_halfway_and_the_test_set_is_the_new_concept():
    river = read_river("friedman-drift", 2000, 0)
    assert river.drift_at == 900
    x, y = river.train.x.double(), river.train.y.double()

    def noise(f, rows: slice, data=(x, y)) -> float:
        """The mean squared residual of concept ``f``: River's unit Gaussian noise where it holds."""
        return float(((data[1][rows] - f(data[0][rows])) ** 2).mean())

    assert noise(_friedman_1, slice(0, 900)) < 1.3 < 5 < noise(_friedman_swapped, slice(0, 900))
    assert noise(_friedman_swapped, slice(900, None)) < 1.3 < 5 < noise(_friedman_1, slice(900, None))
    test = (river.test.x.double(), river.test.y.double())
    assert noise(_friedman_swapped, slice(None), test) < 1.3


def test_a_generated_stream_depends_on_its_seed_only():
    first, again, other = read_river("agrawal", 400, 3), read_river("agrawal", 400, 3), read_river("agrawal", 400, 4)
    for a, b in ((first.train, again.train), (first.test, again.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(first.train.x, other.train.x)


def test_the_test_set_is_the_streams_continuation():
    short, longer = read_river("hyperplane", 1000, 0), read_river("hyperplane", 2000, 0)
    assert torch.equal(short.test.x, longer.train.x[900:1000])


def test_a_bundled_dataset_is_read_whole_at_most():
    river = read_river("image-segments", 10**6, 0)
    assert len(river.train) + len(river.test) == 2310


def test_too_few_examples_for_a_test_set_fail_naming_the_key():
    with pytest.raises(DatasetError, match="dataset.river_examples"):
        read_river("sea", 9, 0)


def test_no_stream_touches_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in RIVER_STREAMS:
        assert len(read_river(name, 100, 0).train) == 90


def _agrawal_1(x: dict) -> int:
    """Agrawal et al.'s function 1: the salary band that buys depends on age."""
    low, high = (50000, 100000) if x["age"] < 40 else (75000, 125000) if x["age"] < 60 else (25000, 75000)
    return int(low <= x["salary"] <= high)


def _agrawal_2(x: dict) -> int:
    """Agrawal et al.'s function 2: the education levels that buy depend on age."""
    levels = (0, 1) if x["age"] < 40 else (1, 2, 3) if x["age"] < 60 else (2, 3, 4)
    return int(x["elevel"] in levels)


def test_agrawal_changes_concept_abruptly_where_declared():
    river = read_river("agrawal", 2000, 0)
    assert river.drift_at == 900
    names = river.task.extra["features"]
    rows = [dict(zip(names, row)) for row in river.train.x.tolist()]
    labels = river.train.y.tolist()
    # The drift spans about twice its width (a hundredth of the stream) around its centre.
    before, after = range(0, 860), range(940, 1800)
    assert all(labels[i] == _agrawal_1(rows[i]) for i in before)
    assert all(labels[i] == _agrawal_2(rows[i]) for i in after)
    assert sum(labels[i] != _agrawal_1(rows[i]) for i in after) > 100


def test_sea_moves_its_threshold_where_declared():
    river = read_river("sea", 4000, 0)
    x, y = river.train.x, river.train.y.bool()
    # Where thresholds 8 and 9.5 disagree, labels follow the first before the drift, the second after
    # (up to the stream's 10 % label noise).
    band = ((x[:, 0] + x[:, 1]) > 8) & ((x[:, 0] + x[:, 1]) <= 9.5)
    assert river.drift_at == 1800
    before, after = band.clone(), band.clone()
    before[1400:], after[:2200] = False, False
    assert y[before].float().mean() > 0.8
    assert y[after].float().mean() < 0.2


def test_simulate_streams_the_examples_in_river_order_and_tests_on_the_continuation():
    config = river_config()
    river = read_river("agrawal", 600, 0)
    stream = simulated_stream(config)
    chunks = list(stream.chunks)
    assert [len(c) for c in chunks] == [180, 180, 180]
    assert torch.equal(torch.cat([c.data.x for c in chunks]), river.train.x)
    assert stream.test is not None and torch.equal(stream.test.x, river.test.x)
    task = load_stream_task(config)
    assert task.task == stream.task
    assert task.test is not None and torch.equal(task.test.y, river.test.y)


def test_replay_sends_the_simulated_chunks():
    config = river_config()
    sent = list(chunk_source(config))
    simulated = list(simulated_stream(config).chunks)
    assert [c.chunk_id for c in sent] == [c.index for c in simulated]
    assert all(torch.equal(s.tensors["x"], c.data.x) for s, c in zip(sent, simulated))


@pytest.mark.slow  # trains
def test_a_teams_mlp_learns_a_river_stream_under_the_adaptive_policy():
    config = river_config(
        "sea",
        1200,
        learner={"name": "sm", "model": "examples.custom.tabular:build"},
        train={"epochs": 3, "patience": 2},
        policy={"name": "adaptive"},
    )
    results = run_simulation(config, progress=False)
    rows = results["series"]
    assert len(rows) == 3
    # The first chunk is predicted by the untrained model; training on it makes the later ones better.
    assert rows[0]["decision"] == "train"
    assert rows[-1]["prequential_error"] < rows[0]["prequential_error"]
    assert results["summary"]["cer"] == pytest.approx(sum(row["test_error"] for row in rows))


def test_simulate_runs_a_friedman_regression_end_to_end():
    config = river_config(
        "friedman",
        600,
        learner={"name": "sm", "width": 16},
        train={"epochs": 20, "patience": 5, "batch_size": 16},
        task={"measure": "mse"},
        policy={"name": "fixed", "wait": 1},
    )
    results = run_simulation(config, progress=False)
    rows, summary = results["series"], results["summary"]
    assert len(rows) == 3 and summary["measure"] == "mse"
    # The first chunk meets a model that answers its target's mean: about the input-blind baseline.
    assert rows[0]["prequential_mse"] < 2 * rows[0]["baseline_mse"]
    assert rows[-1]["prequential_mse"] < 0.5 * rows[0]["prequential_mse"]
    assert summary["cumulative_mse"] == pytest.approx(sum(row["test_mse"] for row in rows))


@pytest.mark.integration
@pytest.mark.slow
def test_the_embedded_service_on_a_river_stream_gives_the_simulated_series(tmp_path):
    settings = {
        "dataset.name": "river",
        "dataset.river_stream": "sea",
        "dataset.river_examples": 1500,
        "stream.megabatches": 3,
        "learner.model": "examples.custom.tabular:build",
        "train.epochs": 2,
        "policy.name": "adaptive",
        "serving.kind": "local",
        "daemon.state_dir": tmp_path / "state",
        "daemon.checkpoint_dir": tmp_path / "ms",
    }
    options = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]

    def alma(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "alma_daemon", *args, "--no-progress", *options],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=PROCESS_LIMIT_SECONDS,
        )
        assert done.returncode == 0, done.stderr

    alma("simulate", "--out", str(tmp_path / "simulated"))
    alma("run", "--embedded", "--replay", "river", "--until-chunks", "3")
    simulated = json.loads((tmp_path / "simulated" / "results.json").read_text())["series"]
    served = json.loads((tmp_path / "state" / "results.json").read_text())["series"]
    assert len(served) == 3
    assert exact(served) == exact(simulated)
