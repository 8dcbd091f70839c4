"""A drifting stream (stream.drift): chunks and test set change alike from the first drifted chunk on."""

from __future__ import annotations

import math

import pytest
import torch

from alma_daemon.config import ConfigError, DriftConfig, build_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo, resolve_data_root
from alma_daemon.data.streams import (
    Chunk,
    build_drift,
    drifted,
    label_permutation,
    partition,
    rotate_images,
    shifted_classes,
)
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
    turned = drift.test_set(data, 1)
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
    after = learner.evaluate(drift.test_set(test, 3))["error"]
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


def test_a_prior_shift_makes_a_seeded_half_of_the_classes_rarer_and_keeps_chunk_sizes():
    data = separable_data(MNIST_TASK, 4000, seed=0)
    drift = build_drift(DriftConfig(kind="prior_shift", strength=0.9, at=2), MNIST_TASK, seed=0)
    rarer = shifted_classes(10, seed=0)
    assert len(rarer) == 5 and torch.equal(rarer, shifted_classes(10, seed=0))
    assert drift.chunk(Chunk(1, data)).data is data  # before at: untouched
    shifted = drift.chunk(Chunk(2, data)).data
    assert shifted.x.shape == data.x.shape and shifted.y.shape == data.y.shape
    share = torch.isin(shifted.y, rarer).float().mean().item()
    # Half the classes at a tenth of their weight: about 0.1 / 1.1 of the examples.
    assert abs(share - 0.1 / 1.1) < 0.03 and abs(torch.isin(data.y, rarer).float().mean().item() - 0.5) < 0.03
    again = drift.chunk(Chunk(2, data)).data
    assert torch.equal(again.x, shifted.x) and torch.equal(again.y, shifted.y)  # seeded by the chunk's id
    other = drift.chunk(Chunk(3, data)).data
    assert not torch.equal(other.y, shifted.y)
    for x, y in zip(shifted.x[:50], shifted.y[:50], strict=True):  # resampled examples, unchanged
        assert any(torch.equal(x, original) and y == label for original, label in zip(data.x, data.y, strict=True))


def test_a_gradual_rotation_ramps_its_angle_linearly_over_its_chunks():
    data = separable_data(MNIST_TASK, 8, seed=0)
    drift = build_drift(DriftConfig(kind="rotate", degrees=10.0, at=5, over=4), MNIST_TASK, seed=0)
    assert [drift.amount(i) for i in (4, 5, 6, 7, 8, 20)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert "to chunk 8" in drift.description
    for index, degrees in [(5, 2.5), (6, 5.0), (8, 10.0), (30, 10.0)]:
        assert torch.equal(drift.chunk(Chunk(index, data)).data.x, rotate_images(data.x, degrees))
        assert torch.equal(drift.test_set(data, index).x, rotate_images(data.x, degrees))
    assert torch.equal(drift.chunk(Chunk(4, data)).data.x, data.x)
    abrupt = build_drift(DriftConfig(kind="rotate", degrees=10.0, at=5), MNIST_TASK, seed=0)
    assert torch.equal(abrupt.chunk(Chunk(5, data)).data.x, rotate_images(data.x, 10.0))


def test_a_gradual_prior_shift_ramps_its_strength():
    data = separable_data(MNIST_TASK, 4000, seed=0)
    drift = build_drift(DriftConfig(kind="prior_shift", strength=1.0, at=1, over=2), MNIST_TASK, seed=0)
    rarer = shifted_classes(10, seed=0)
    halfway = torch.isin(drift.chunk(Chunk(1, data)).data.y, rarer).float().mean().item()
    assert abs(halfway - 0.5 / 1.5) < 0.03
    assert not torch.isin(drift.chunk(Chunk(2, data)).data.y, rarer).any()


@pytest.mark.parametrize(
    "drift_config",
    [
        {"kind": "rotate", "degrees": 10.0, "at": 2, "over": 3},
        {"kind": "prior_shift", "strength": 0.9, "at": 3},
        {"kind": "prior_shift", "strength": 0.9, "at": 2, "over": 3},
    ],
)
def test_the_engine_measures_on_a_test_set_drifted_as_the_chunk_is(drift_config):
    config = build_config(
        {"train": {"epochs": 1}, "learner": {"width": 8}, "stream": {"drift": drift_config}, "policy": {"wait": 9}}
    )
    test = separable_data(MNIST_TASK, 200, seed=2)
    learner = build_learner("sm", MNIST_TASK, config.learner, config.seed)
    engine = Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), test_set=test)
    drift = build_drift(config.stream.drift, MNIST_TASK, config.stream.seed)
    for index in range(1, 7):
        expected = drift.test_set(test, index)
        got = engine.test_set_at(index)
        assert torch.equal(got.x, expected.x) and torch.equal(got.y, expected.y)
        assert (got is test) == (index < drift.at)


def test_drift_ramps_and_strengths_are_checked_in_one_line():
    cases = [
        ({"kind": "prior_shift", "at": 2, "strength": 1.5}, "stream.drift.strength: must be <= 1"),
        ({"kind": "prior_shift", "at": 2, "strength": 0.0}, "stream.drift.strength: must be > 0"),
        ({"kind": "rotate", "at": 2, "over": 0}, "stream.drift.over: must be > 0"),
    ]
    for drift_config, message in cases:
        with pytest.raises(ConfigError, match=message) as error:
            build_config({"stream": {"drift": drift_config}})
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="stream.drift.over: permute_labels is abrupt only") as error:
        build_drift(DriftConfig(kind="permute_labels", at=2, over=5), MNIST_TASK, seed=0)
    assert "\n" not in str(error.value)
