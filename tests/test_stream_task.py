"""A stream's task and test set, read without its training data, equal those ``alma simulate`` uses."""

from __future__ import annotations

import shutil

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.data.datasets import DatasetError, load_dataset, resolve_data_root
from alma_daemon.data.stream_task import load_stream_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from alma_daemon.research.simulate import simulated_stream
from policies import build_policy
from tests.helpers.data import have
from tests.helpers.text import text_config

needs_mnist = pytest.mark.skipif(not have("mnist"), reason="MNIST files not in the data folder (see README: data)")


def same_data(a: LabeledData | None, b: LabeledData | None) -> bool:
    assert a is not None and b is not None
    return torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@needs_mnist
def test_a_labeled_streams_task_and_test_subset_equal_the_simulated_ones():
    config = build_config({"dataset": {"test_examples": 300}, "stream": {"seed": 7}})
    read, simulated = load_stream_task(config), simulated_stream(config)
    assert read.task == simulated.task
    assert same_data(read.test, simulated.test)


@needs_mnist
def test_the_test_set_is_read_without_the_training_files(tmp_path):
    (tmp_path / "mnist").mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(resolve_data_root(None) / "mnist" / name, tmp_path / "mnist" / name)
    config = build_config({"dataset": {"root": str(tmp_path)}})
    with pytest.raises(DatasetError, match="train-images"):
        load_dataset("mnist", str(tmp_path))
    assert len(load_stream_task(config).test) == 10000


@needs_mnist
def test_a_drifting_streams_test_set_is_drifted_by_the_engine_as_in_simulation():
    config = build_config({"dataset": {"test_examples": 200}, "stream": {"drift": {"kind": "permute_labels", "at": 2}}})
    read, simulated = load_stream_task(config), simulated_stream(config)
    learner = build_learner("sm", read.task, config.learner, 0)
    engines = [
        Engine(learner, build_policy(config.policy), MemoryBuffer(), config, torch.device("cpu"), test_set=test)
        for test in (read.test, simulated.test)
    ]
    for chunk in (1, 2):
        assert same_data(*(engine.test_set_at(chunk) for engine in engines))
    assert not same_data(engines[0].test_set_at(1), engines[0].test_set_at(2))


def test_a_text_streams_task_carries_the_tokenizer_and_the_encoded_test_text(tmp_path):
    config = text_config(tmp_path, dataset={"test_examples": 5})
    read, simulated = load_stream_task(config), simulated_stream(config)
    assert read.task == simulated.task and read.task.kind == "language_model"
    assert same_data(read.test, simulated.test) and len(read.test) == 5
