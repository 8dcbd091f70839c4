"""A user's own labeled arrays: ``.npz`` files holding ``x`` (N x ...) and ``y`` (N): class indexes,
or a regression's float targets.

Files are read with ``allow_pickle=False``: an object array (which would need unpickling) is an
error, never executed. The task (input shape, classes, or a regression) is declared in config,
because a stream of arrays carries no description of itself: ``task.kind: regression``, or
``task.measure`` mse or mae with ``task.kind`` unset, makes ``y`` a float target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from alma_daemon.config import ConfigError, DatasetConfig, TaskConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData

#: The measures that judge a regression (alma_daemon/measures, which sits above data/; a test keeps
#: the two equal): with ``task.kind`` unset, one of them makes the arrays' ``y`` a float target.
REGRESSION_MEASURES = ("mse", "mae")


def declared_kind(terms: TaskConfig) -> str:
    """The kind of task arrays hold: ``task.kind``, else a regression where ``task.measure`` judges one,
    else classification."""
    if terms.kind is not None:
        return terms.kind
    return "regression" if terms.measure in REGRESSION_MEASURES else "classification"


def load_npz(path: str | Path, regression: bool = False) -> LabeledData:
    """``x`` as uint8 or float32 (float64 is narrowed), ``y`` as int64 class indexes, or as float32
    targets (finite) where ``regression``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"arrays file not found: {path}")
    with np.load(path, allow_pickle=False) as arrays:
        missing = {"x", "y"} - set(arrays.files)
        if missing:
            raise ValueError(f"{path}: needs arrays 'x' and 'y'; missing {sorted(missing)} (found {arrays.files})")
        x, y = arrays["x"], arrays["y"]
    if x.dtype == np.float64:
        x = x.astype(np.float32)
    if x.dtype not in (np.uint8, np.float32):
        raise ValueError(f"{path}: x must be uint8 or float32; got {x.dtype}")
    features = torch.from_numpy(np.ascontiguousarray(x))
    if regression:
        if not (np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.integer)) or y.ndim != 1:
            raise ValueError(
                f"{path}: y must be a 1-D array of numbers (a regression's targets); got {y.dtype} {y.shape}"
            )
        if not np.isfinite(y).all():
            raise ValueError(f"{path}: y holds {int((~np.isfinite(y)).sum())} NaN or infinite targets")
        return LabeledData(features, torch.from_numpy(y.astype(np.float32)))
    if np.issubdtype(y.dtype, np.floating) and y.ndim == 1:
        raise ValueError(
            f"{path}: y is {y.dtype}, a classifier's labels are integers; for a float target set task.kind: "
            "regression (or task.measure: mse or mae)"
        )
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
        raise ValueError(f"{path}: y must be a 1-D integer array; got {y.dtype} {y.shape}")
    return LabeledData(features, torch.from_numpy(y.astype(np.int64)))


def arrays_task(config: DatasetConfig, terms: TaskConfig | None = None) -> TaskInfo:
    """The task declared by ``dataset.input_shape`` and ``dataset.num_classes``, or by ``dataset.input_shape``
    alone for a regression (:func:`declared_kind` of ``terms``, the ``task`` section; None: a classifier)."""
    regression = terms is not None and declared_kind(terms) == "regression"
    if regression:
        if not config.input_shape:
            raise ConfigError("dataset.name=arrays needs dataset.input_shape (e.g. [30]) for a regression's features")
        if config.num_classes is not None:
            raise ConfigError("dataset.num_classes: a regression (task.kind, task.measure) has no classes; unset it")
        return TaskInfo("regression", tuple(config.input_shape), 1)
    if not config.input_shape or config.num_classes is None:
        raise ConfigError("dataset.name=arrays needs dataset.input_shape (e.g. [28, 28]) and dataset.num_classes")
    return TaskInfo("classification", tuple(config.input_shape), config.num_classes)
