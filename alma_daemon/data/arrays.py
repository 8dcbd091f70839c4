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

from alma_daemon.data.tensors import LabeledData


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
