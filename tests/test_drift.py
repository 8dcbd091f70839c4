"""A drifting stream (stream.drift): chunks and test set change alike from the first drifted chunk on."""

from __future__ import annotations

import math

import pytest
import torch

from alma_daemon.config import ConfigError, DriftConfig, build_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo, resolve_data_root
from alma_daemon.data.streams import Chunk, build_drift, drifted, label_permutation, partition, rotate_images
from alma_daemon.learners import build_learner
from policies import build_policy
from tests.helpers.data import separable_data


def permute_from(at: int) -> DriftConfig:
    return DriftConfig(kind="permute_labels", at=at)


def test_label_permutation_is_seeded_and_moves_every_class():
    for seed in range(20):
        permutation = label_permutation(10, seed)
        assert sorted(permutation.tolist()) == list(range(10))
        assert all(permutation[c] != c for c in range(10)), permutation
        assert torch.equal(permutation, label_permutation(10, seed))
    assert len({tuple(label_permutation(10, seed).tolist()) for seed in range(20)}) > 1


def test_quarter_turns_are_exact_and_counter_clockwise():
    image = torch.zeros(1, 5, 5, dtype=torch.uint8)
    image[0, 0, 4] = 200  # top right
    turned = rotate_images(image, 90)
    assert turned[0, 0, 0] == 200 and int(turned.sum()) == 200  # to the top left
    assert torch.equal(rotate_images(rotate_images(image, 180), 180), image)
    channels_last = torch.arange(2 * 4 * 4 * 3, dtype=torch.uint8).reshape(2, 4, 4, 3)
    assert torch.equal(
        rotate_images(channels_last, 270, channels_last=True), torch.rot90(channels_last, 3, dims=(1, 2))
    )


def test_other_angles_interpolate_in_the_same_direction_and_keep_dtype_and_shape():
    image = (torch.rand(3, 28, 28, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    nearly_quarter = rotate_images(image, 90.0001)
    assert nearly_quarter.dtype == torch.uint8 and nearly_quarter.shape == image.shape
    assert (nearly_quarter.int() - torch.rot90(image, 1, dims=(1, 2)).int()).abs().max() <= 1
    assert not torch.equal(rotate_images(image, 30), image)


def test_only_chunks_from_at_on_are_drifted():
    data = separable_data(MNIST_TASK, 60, seed=0)
    drift = build_drift(permute_from(3), MNIST_TASK, seed=0)
    chunks = list(drifted((Chunk(i, part) for i, part in enumerate(partition(data, 4, seed=0), start=1)), drift))
    originals = partition(data, 4, seed=0)
    permutation = label_permutation(10, 0)
    assert [chunk.index for chunk in chunks] == [1, 2, 3, 4]  # every chunk passes, drifted or not
    for chunk, original in zip(chunks, originals, strict=True):
        expected = permutation[original.y] if chunk.index >= 3 else original.y
        assert torch.equal(chunk.data.y, expected) and torch.equal(chunk.data.x, original.x)


def test_rotation_drift_turns_the_images_and_keeps_the_labels():
    data = separable_data(MNIST_TASK, 20, seed=0)
    drift = build_drift(DriftConfig(kind="rotate", degrees=90.0, at=1), MNIST_TASK, seed=0)
    turned = drift.transform(data)
    assert torch.equal(turned.y, data.y) and torch.equal(turned.x, torch.rot90(data.x, 1, dims=(1, 2)))


def test_the_engine_measures_on_the_drifted_test_set_from_the_first_drifted_chunk():
    # Tardy policy: the model never changes, so only the test set can move the test error.
    config = build_config(
        {
            "train": {"epochs": 1},
            "learner": {"width": 8},
            "stream": {"drift": {"kind": "permute_labels", "at": 3}},
            "policy": {"wait": 9},
        }
    )
    test = separable_data(MNIST_TASK, 200, seed=2)
    learner = build_learner("sm", MNIST_TASK, config.learner, config.seed)
    engine = Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), test_set=test)
    drift = build_drift(config.stream.drift, MNIST_TASK, config.stream.seed)
    data = separable_data(MNIST_TASK, 300, seed=1)
    for i, part in enumerate(partition(data, 5, seed=0), start=1):
        engine.on_chunk(drift.chunk(Chunk(i, part)))
    before = learner.evaluate(test)["error"]
    after = learner.evaluate(drift.transform(test))["error"]
    assert before != after
    assert [r["test_error"] for r in engine.state.series] == [before, before, after, after, after]


def test_drift_needs_its_first_chunk_and_labeled_images():
    with pytest.raises(ConfigError, match="stream.drift.at"):
        build_config({"stream": {"drift": {"kind": "rotate"}}})
    with pytest.raises(ConfigError, match="stream.drift.at: must be > 0"):
        build_config({"stream": {"drift": {"kind": "rotate", "at": 0}}})
    with pytest.raises(ConfigError, match="stream.drift.kind"):
        build_config({"stream": {"drift": {"kind": "shuffle", "at": 2}}})
    # Values that would be read by nothing, or crash the run half-way, fail at start-up.
    with pytest.raises(ConfigError, match="stream.drift.at: set, but stream.drift.kind is none"):
        build_config({"stream": {"drift": {"at": 5}}})
    with pytest.raises(ConfigError, match="stream.drift.at: chunk 40 never comes, the stream has stream.megabatches=4"):
        build_config({"stream": {"megabatches": 4, "drift": {"kind": "permute_labels", "at": 40}}})
    for angle in (math.inf, math.nan):
        with pytest.raises(ConfigError, match="stream.drift.degrees: Input should be a finite number"):
            build_config({"stream": {"drift": {"kind": "rotate", "at": 2, "degrees": angle}}})
    assert build_config({"stream": {"megabatches": 4, "drift": {"kind": "rotate", "at": 4}}}).stream.drift.at == 4
    language = TaskInfo("language_model", (64,), 1000)
    with pytest.raises(ConfigError, match="stream.drift.kind: permute_labels needs labeled examples"):
        build_drift(permute_from(2), language, seed=0)
    vectors = TaskInfo("classification", (16,), 3)
    with pytest.raises(ConfigError, match="stream.drift.kind: rotate needs images"):
        build_drift(DriftConfig(kind="rotate", at=2), vectors, seed=0)


@pytest.mark.skipif(not (resolve_data_root(None) / "mnist").is_dir(), reason="MNIST files not in the data folder")
def test_replay_publishes_the_drifted_chunks_the_simulator_trains_on():
    from alma_daemon.research.simulate import simulated_stream
    from alma_daemon.transports.replay import chunk_source

    config = build_config(
        {"stream": {"megabatches": 50, "train_examples": 500, "drift": {"kind": "rotate", "degrees": 30.0, "at": 3}}}
    )
    simulated = simulated_stream(config).chunks
    sent_chunks = [sent for _, sent in zip(range(4), chunk_source(config))]
    assert [sent.chunk_id for sent in sent_chunks] == [1, 2, 3, 4]  # else the loop below checks nothing
    for chunk, sent in zip(simulated, sent_chunks):
        assert chunk.index == sent.chunk_id
        assert torch.equal(chunk.data.x, sent.tensors["x"]) and torch.equal(chunk.data.y, sent.tensors["y"])
    undrifted = simulated_stream(build_config({"stream": {"megabatches": 50, "train_examples": 500}})).chunks
    changed = [
        not torch.equal(a.data.x, b.data.x) for _, a, b in zip(range(4), undrifted, simulated_stream(config).chunks)
    ]
    assert changed == [False, False, True, True]


def test_a_replay_refuses_a_drift_its_data_cannot_take_before_it_publishes_anything():
    """``alma replay`` builds its chunk source before it connects to the transport: the refusal
    comes at the call, not at the first chunk (when a topic may already have been made)."""
    from alma_daemon.transports.replay import labeled_chunks, text_chunks

    config = build_config(
        {"dataset": {"name": "ptb"}, "learner": {"name": "switch-lm"}, "stream": {"drift": {"kind": "rotate", "at": 2}}}
    )
    with pytest.raises(ConfigError, match="stream.drift.kind: rotate needs labeled examples"):
        text_chunks(config)
    vectors = separable_data(TaskInfo("classification", (16,), 3), 30, seed=0)
    rotated = build_config({"stream": {"megabatches": 3, "drift": {"kind": "rotate", "at": 2}}})
    with pytest.raises(ConfigError, match="stream.drift.kind: rotate needs images"):
        labeled_chunks(vectors, rotated, TaskInfo("classification", (16,), 3))
