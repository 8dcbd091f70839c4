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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from alma_daemon.config.sections import DATASET_NAMES
from alma_daemon.data.tensors import LabeledData


class DatasetError(FileNotFoundError):
    """A dataset file is missing or malformed; the message says which file and where to put it."""


#: How a model normalizes its raw inputs: ``pixels`` (0-255 images, the dataset's per-channel
#: statistics), ``standardize`` (per-feature statistics of the stream's first chunk) or ``none``
#: (the model takes the features as they come).
NORMALIZATIONS = ("pixels", "standardize", "none")


@dataclass(frozen=True)
class TaskInfo:
    """What a model needs to know about its inputs and outputs; saved in every checkpoint's spec."""

    kind: str  # "classification", "regression" or "language_model"
    input_shape: tuple[int, ...]
    #: Classes of a classifier, tokens of a language model; 1 for a regression (one number out).
    num_classes: int
    #: What the model does to raw inputs first (:data:`NORMALIZATIONS`).
    normalization: str = "pixels"
    #: ``pixels``: per-channel mean and std on the [0, 1] scale of 0-255 raw pixels. ``standardize``:
    #: per-feature mean and std in raw units (one value per input value, flattened), taken from the
    #: stream's first chunk (empty until then). ``none``: unused.
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    #: Channel axis of a raw example ("last" for HWC images as stored on the wire).
    channels_last: bool = False
    augment: bool = False
    extra: dict = field(default_factory=dict)
    #: The measure the task is judged by (``task.measure``); "" = the kind's default (alma_daemon/measures).
    measure: str = ""
    #: The classes' names in label-index order (``task.classes``); empty = their indexes.
    classes: tuple[str, ...] = ()
    #: A binary task's positive class (``task.positive_class``), by index.
    positive: int = 1
    false_negative_cost: float = 1.0
    false_positive_cost: float = 1.0
    #: A weight per class of the training loss (``task.class_weights``); empty = unweighted.
    class_weights: tuple[float, ...] = ()
    #: A regression's target statistics: networks train on (y - target_mean) / target_std and the
    #: learner answers in the target's units; None until taken from the stream's first chunk.
    target_mean: float | None = None
    target_std: float | None = None
    #: A binary task's decision rule (``task.decision``): "" (the most probable class), cost, precision,
    #: recall or threshold; ``decision_target`` is the precision, recall or threshold it names.
    decision: str = ""
    decision_target: float | None = None
    #: (slope, intercept) mapping the positive class's log-odds to calibrated ones, and the threshold on
    #: the calibrated probability: chosen on the pooled validation set after each stage
    #: (alma_daemon/measures/decision.py), saved with the version.
    calibration: tuple[float, float] | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}; got {self.normalization!r}")

    @property
    def regression(self) -> bool:
        return self.kind == "regression"

    @property
    def target_kind(self) -> str:
        """What the measures call the task: binary, multiclass, regression or language_model."""
        if self.kind == "classification":
            return "binary" if self.num_classes == 2 else "multiclass"
        return self.kind

    @property
    def is_team_task(self) -> bool:
        """A team's task (its own measure, two classes, a regression), as opposed to the paper's balanced
        classes and language models: the stage recipe, the baseline and the reference follow the team's
        terms, while the paper's series stay as published."""
        return (bool(self.measure) or self.target_kind in ("binary", "regression")) and self.kind != "language_model"

    def class_name(self, index: int) -> str:
        """A class's name (``task.classes``), else its index as text."""
        return self.classes[index] if self.classes else str(index)

    def with_statistics(self, x: torch.Tensor) -> TaskInfo:
        """This standardizing task with per-feature statistics of ``x`` (N x input_shape): a feature
        that does not vary keeps a std of 1, so it passes centred instead of dividing by zero."""
        flat = x.reshape(len(x), -1).double()
        mean, std = flat.mean(0), flat.std(0, correction=0)
        std = torch.where(std > 1e-6 * (1 + mean.abs()), std, torch.ones_like(std))
        return replace(self, mean=tuple(mean.float().tolist()), std=tuple(std.float().tolist()))

    def with_target_statistics(self, y: torch.Tensor) -> TaskInfo:
        """This regression with the mean and std of targets ``y``; a constant target keeps a std of 1."""
        target = y.double()
        mean, std = float(target.mean()), float(target.std(correction=0))
        return replace(self, target_mean=mean, target_std=std if std > 1e-6 * (1 + abs(mean)) else 1.0)

    @property
    def awaits_target_statistics(self) -> bool:
        """A regression before its first chunk: its target statistics are not known yet."""
        return self.regression and self.target_std is None

    @property
    def pixels(self) -> bool:
        """Raw inputs are pixels in [0, 255] (what the wire and serving check)."""
        return self.normalization == "pixels"

    @property
    def awaits_statistics(self) -> bool:
        """A standardizing task before its first chunk: its statistics are not known yet."""
        return self.normalization == "standardize" and not self.mean

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "normalization": self.normalization,
            "mean": list(self.mean),
            "std": list(self.std),
            "channels_last": self.channels_last,
            "augment": self.augment,
            "extra": self.extra,
            # The task's own terms, written only where set, so a paper task's spec reads as before.
            **{key: value for key, value in self._target_terms().items() if value != _TARGET_DEFAULTS[key]},
        }

    def _target_terms(self) -> dict:
        return {
            "measure": self.measure,
            "classes": list(self.classes),
            "positive": self.positive,
            "false_negative_cost": self.false_negative_cost,
            "false_positive_cost": self.false_positive_cost,
            "class_weights": list(self.class_weights),
            "target_mean": self.target_mean,
            "target_std": self.target_std,
            "decision": self.decision,
            "decision_target": self.decision_target,
            "calibration": None if self.calibration is None else list(self.calibration),
            "threshold": self.threshold,
        }

    @classmethod
    def from_dict(cls, data: dict) -> TaskInfo:
        return cls(
            kind=data["kind"],
            input_shape=tuple(data["input_shape"]),
            num_classes=int(data["num_classes"]),
            normalization=str(data.get("normalization", "pixels")),
            mean=tuple(data.get("mean", ())),
            std=tuple(data.get("std", ())),
            channels_last=bool(data.get("channels_last", False)),
            augment=bool(data.get("augment", False)),
            extra=dict(data.get("extra", {})),
            measure=str(data.get("measure", "")),
            classes=tuple(data.get("classes", ())),
            positive=int(data.get("positive", 1)),
            false_negative_cost=float(data.get("false_negative_cost", 1.0)),
            false_positive_cost=float(data.get("false_positive_cost", 1.0)),
            class_weights=tuple(float(w) for w in data.get("class_weights", ())),
            target_mean=None if data.get("target_mean") is None else float(data["target_mean"]),
            target_std=None if data.get("target_std") is None else float(data["target_std"]),
            decision=str(data.get("decision", "")),
            decision_target=None if data.get("decision_target") is None else float(data["decision_target"]),
            calibration=None if data.get("calibration") is None else _pair(data["calibration"]),
            threshold=None if data.get("threshold") is None else float(data["threshold"]),
        )


#: The target terms of a task that sets none (a paper task): what its spec.json leaves out.
_TARGET_DEFAULTS = {
    "measure": "",
    "classes": [],
    "positive": 1,
    "false_negative_cost": 1.0,
    "false_positive_cost": 1.0,
    "class_weights": [],
    "target_mean": None,
    "target_std": None,
    "decision": "",
    "decision_target": None,
    "calibration": None,
    "threshold": None,
}


def _pair(values: list) -> tuple[float, float]:
    slope, intercept = (float(v) for v in values)
    return slope, intercept


@dataclass(frozen=True)
class Dataset:
    """A training set, a test set and the task they define."""

    train: LabeledData
    test: LabeledData
    task: TaskInfo


MNIST_TASK = TaskInfo("classification", (28, 28), 10, mean=(0.1307,), std=(0.3081,))
# Statistics of the original CIFAR-10 training set (the JPEG-decoded copy differs in the 3rd decimal).
CIFAR10_TASK = TaskInfo(
    "classification",
    (32, 32, 3),
    10,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
    channels_last=True,
    augment=True,
)

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
