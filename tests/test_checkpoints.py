"""The checkpoint store: a version is complete on disk, or absent, after a crash or a power loss."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from alma_daemon.core.checkpoints import TRASH_PREFIX, VALIDATION, WEIGHTS, CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.learners import build_learner
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data


def test_every_tensor_file_reaches_the_disk_before_its_version_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    synced: list[Path] = []

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store = CheckpointStore(tmp_path, "alma")
    learner = build_learner("sm", MNIST_TASK, learner_settings("sm", {"width": 8}), seed=1)
    sample = separable_data(MNIST_TASK, 16)
    store.save(learner, 1, {}, validation=sample)

    # Synced in the staging folder (".1-..."), so before the rename that makes the version count.
    staged = {path.name for path in synced if path.parent.name.startswith(".1-")}
    assert {WEIGHTS, VALIDATION} <= staged
    assert store.versions() == [1]
    saved = store.load(1).model.state_dict()
    assert all(torch.equal(saved[name], tensor) for name, tensor in learner.model.state_dict().items())
    validation = store.validation(1)
    assert validation is not None and torch.equal(validation.x, sample.x) and torch.equal(validation.y, sample.y)


def test_tied_weights_are_saved_once_and_the_same_weights_make_the_same_bytes(tmp_path: Path) -> None:
    """A Switch LM ties its output layer to its embedding: three members, three tied pairs. safetensors'
    save_model wrote the dropped names in an order that changed from save to save."""
    from tests.helpers.switch_lm import tiny_learner

    learner = tiny_learner("switch-lm-ens", members=3)
    store = CheckpointStore(tmp_path, "alma")
    for version in range(1, 6):
        store.save(learner, version, {})
    files = {(store.path(version) / WEIGHTS).read_bytes() for version in range(1, 6)}
    assert len(files) == 1
    loaded = store.load(1).model
    assert all(member.head.weight.data_ptr() == member.wte.weight.data_ptr() for member in loaded)  # still tied
    assert all(torch.equal(a, b) for a, b in zip(learner.model.state_dict().values(), loaded.state_dict().values()))


def test_a_version_is_deleted_whole_and_a_crash_part_way_leaves_trash_not_a_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path, "alma")
    learner = build_learner("sm", MNIST_TASK, learner_settings("sm", {"width": 8}), seed=1)
    for version in (1, 2, 3):
        store.save(learner, version, {})
    store.delete(1)
    assert store.versions() == [2, 3] and sorted(p.name for p in store.folder.iterdir()) == ["2", "3"]

    class Crash(BaseException):
        pass

    def crash_part_way(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / WEIGHTS).unlink()
        raise Crash

    listed = store.versions()
    with monkeypatch.context() as patched, pytest.raises(Crash):
        patched.setattr(shutil, "rmtree", crash_part_way)
        store.delete(2)
    assert store.versions() == [3]
    assert store.metrics(2) is None  # a reader that listed it before (alma versions) skips it
    assert [p.name.startswith(f"{TRASH_PREFIX}2-") for p in store.folder.iterdir() if p.name != "3"] == [True]
    assert listed == [2, 3] and store.metrics(3) == {"version": 3}

    store.sweep_trash()
    assert sorted(p.name for p in store.folder.iterdir()) == ["3"]
    store.delete(7)  # nothing there: nothing to do
