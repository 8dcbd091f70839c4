"""A user's own labeled arrays: ``.npz`` files holding ``x`` (N x ...) and ``y`` (N).

Files are read with ``allow_pickle=False``: an object array (which would need unpickling) is an
error, never executed. The task (input shape, classes) is declared in config, because a stream of
arrays carries no description of itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from alma_daemon.config import ConfigError, DatasetConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData


def load_npz(path: str | Path) -> LabeledData:
    """``x`` as uint8 or float32 (float64 is narrowed), ``y`` as int64."""
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
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
        raise ValueError(f"{path}: y must be a 1-D integer array; got {y.dtype} {y.shape}")
    return LabeledData(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64)))


def arrays_task(config: DatasetConfig) -> TaskInfo:
    """The task declared by ``dataset.input_shape`` and ``dataset.num_classes``."""
    if not config.input_shape or config.num_classes is None:
        raise ConfigError("dataset.name=arrays needs dataset.input_shape (e.g. [28, 28]) and dataset.num_classes")
    return TaskInfo("classification", tuple(config.input_shape), config.num_classes)
