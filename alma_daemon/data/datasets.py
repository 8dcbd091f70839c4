"""Dataset loaders (local files only, never a download) behind a registry.

Each dataset registers its :class:`TaskInfo` (input shape, classes, the normalization that the
model applies to raw inputs) and a reader of one split, so the test set can be read without the
training set (:func:`load_test_set`: the daemon needs only the task and the test set).
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alma_daemon.config.sections import DATASET_NAMES
from alma_daemon.data.task_info import CIFAR10_TASK as CIFAR10_TASK
from alma_daemon.data.task_info import MNIST_TASK as MNIST_TASK
from alma_daemon.data.task_info import NORMALIZATIONS as NORMALIZATIONS
from alma_daemon.data.task_info import TaskInfo as TaskInfo
from alma_daemon.data.tensors import LabeledData


class DatasetError(FileNotFoundError):
    """A dataset file is missing or malformed; the message says which file and where to put it."""


@dataclass(frozen=True)
class Dataset:
    """A training set, a test set and the task they define."""

    train: LabeledData
    test: LabeledData
    task: TaskInfo


#: Reads one split ("train" or "test") of a dataset from the data folder.
SplitReader = Callable[[Path, str], LabeledData]


@dataclass(frozen=True)
class DatasetFiles:
    """A registered dataset: the task it defines and the reader of its splits."""

    task: TaskInfo
    read: SplitReader


_LOADERS: dict[str, DatasetFiles] = {}


def register_dataset(name: str, task: TaskInfo) -> Callable[[SplitReader], SplitReader]:
    def wrap(read: SplitReader) -> SplitReader:
        _LOADERS[name] = DatasetFiles(task, read)
        return read

    return wrap


def dataset_names() -> list[str]:
    return sorted(_LOADERS)


def resolve_data_root(root: str | None) -> Path:
    """The data folder: explicit config, else $ALMA_DATA_DIR, else ./data, else ../shared/data."""
    if root:
        return Path(root).expanduser()
    env = os.environ.get("ALMA_DATA_DIR")
    if env:
        return Path(env).expanduser()
    for candidate in (Path("data"), Path("../shared/data")):
        if candidate.is_dir():
            return candidate
    return Path("data")


def _files(name: str) -> DatasetFiles:
    if name in _LOADERS:
        return _LOADERS[name]
    if name in DATASET_NAMES:
        raise DatasetError(
            f"dataset {name!r} has no train and test files of its own to load; alma simulate and alma run read it "
            f"through its stream (the datasets of files: {', '.join(dataset_names())})"
        )
    raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASET_NAMES))}")


def load_dataset(name: str, root: str | None = None) -> Dataset:
    """Load dataset ``name`` from ``root`` (see :func:`resolve_data_root`)."""
    files, folder = _files(name), resolve_data_root(root)
    return Dataset(files.read(folder, "train"), files.read(folder, "test"), files.task)


def load_test_set(name: str, root: str | None = None) -> tuple[TaskInfo, LabeledData]:
    """The task and the test set of dataset ``name``, without reading its training set."""
    files = _files(name)
    return files.task, files.read(resolve_data_root(root), "test")


def _find(root: Path, subdirs: tuple[str, ...], filename: str, what: str) -> Path:
    for sub in subdirs:
        path = root / sub / filename
        if path.is_file():
            return path
    tried = ", ".join(str(root / sub / filename) for sub in subdirs)
    raise DatasetError(
        f"{what}: file {filename!r} not found (looked in {tried}); put the official file in "
        f"{root / subdirs[0]} or point dataset.root / $ALMA_DATA_DIR at the folder holding it"
    )


def _read_idx(path: Path, expected_magic: int) -> np.ndarray:
    """The IDX array in ``path``, read-only: callers copy it before they hand it out."""
    stat = path.stat()
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return _decoded_idx(str(path.resolve()), version, expected_magic)


# Gunzipping MNIST takes about 0.2 s of CPU, and one process reads it once per run: `alma study`,
# `alma grid` and the tests run dozens of runs each. The key holds the file's inode, mtime and size,
# so a replaced or rewritten file is read again.
@functools.lru_cache(maxsize=8)
def _decoded_idx(path_name: str, version: tuple[int, int, int], expected_magic: int) -> np.ndarray:
    path = Path(path_name)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    (magic,) = struct.unpack(">I", data[:4])
    if magic != expected_magic:
        raise DatasetError(f"{path}: not an IDX file of the expected kind (magic {magic:#x})")
    ndim = magic & 0xFF
    shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise DatasetError(f"{path}: truncated (expected {shape}, found {array.size} bytes of data)")
    return array.reshape(shape)


#: The file name prefix of each MNIST split.
_MNIST_SPLITS = {"train": "train", "test": "t10k"}


@register_dataset("mnist", MNIST_TASK)
def read_mnist(root: Path, split: str) -> LabeledData:
    """A split of MNIST from its two IDX files (``.gz`` as distributed, or uncompressed)."""

    def read(stem: str, magic: int) -> torch.Tensor:
        subdirs = ("mnist", "MNIST/raw", ".")
        for name in (stem + ".gz", stem):
            for sub in subdirs:
                if (root / sub / name).is_file():
                    return torch.from_numpy(_read_idx(root / sub / name, magic).copy())
        return torch.from_numpy(_read_idx(_find(root, subdirs, stem + ".gz", "MNIST"), magic).copy())

    prefix = _MNIST_SPLITS[split]
    return LabeledData(read(f"{prefix}-images-idx3-ubyte", 0x803), read(f"{prefix}-labels-idx1-ubyte", 0x801).long())


_CIFAR_BIN_DIRS = ("cifar-10-batches-bin", "cifar10-jpeg/cifar-10-batches-bin", "cifar10/cifar-10-batches-bin")
_CIFAR_PY_DIRS = ("cifar-10-batches-py", "cifar10/cifar-10-batches-py")


def _cifar_from_binary(directory: Path, names: list[str]) -> LabeledData:
    xs, ys = [], []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise DatasetError(f"CIFAR-10: file {name!r} missing in {directory}")
        records = np.fromfile(path, dtype=np.uint8)
        if records.size % 3073:
            raise DatasetError(f"{path}: size {records.size} is not a multiple of 3073-byte records")
        records = records.reshape(-1, 3073)
        ys.append(records[:, 0].astype(np.int64))
        xs.append(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return LabeledData(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))


def _cifar_from_python(directory: Path, names: list[str]) -> LabeledData:
    # The official python format is a pickle; unpickling runs code, so the opcodes are only parsed.
    from alma_daemon.data.cifar_pickle import read_cifar_python_batch

    xs, ys = [], []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise DatasetError(f"CIFAR-10: file {name!r} missing in {directory}")
        x, y = read_cifar_python_batch(path)
        xs.append(x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(y)
    return LabeledData(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))


#: The batch files of each CIFAR-10 split.
_CIFAR_SPLITS = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


@register_dataset("cifar10", CIFAR10_TASK)
def read_cifar10(root: Path, split: str) -> LabeledData:
    """A split of CIFAR-10 from the official binary layout, else the official python layout; images HWC uint8."""
    names = _CIFAR_SPLITS[split]
    for sub in _CIFAR_BIN_DIRS:
        directory = root / sub
        if (directory / "data_batch_1.bin").is_file():
            return _cifar_from_binary(directory, [n + ".bin" for n in names])
    for sub in _CIFAR_PY_DIRS:
        directory = root / sub
        if (directory / "data_batch_1").is_file():
            return _cifar_from_python(directory, names)
    raise DatasetError(
        f"CIFAR-10: no data_batch_1.bin or data_batch_1 found under {root} (looked in "
        f"{', '.join(_CIFAR_BIN_DIRS + _CIFAR_PY_DIRS)}); extract the official cifar-10-binary.tar.gz "
        f"into {root} or point dataset.root / $ALMA_DATA_DIR at its parent folder"
    )
