"""JSON files that a crash never leaves half-written: results, status, checkpoints' specs, serving state."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int = 1, sort_keys: bool = False) -> None:
    """Replace ``path`` with ``data`` as JSON: a reader sees the old file or the new one, never a mix.

    NaN and infinities become null: JSON has none, and jq or a browser rejects the non-standard tokens
    Python would write.
    """
    write_text_atomic(path, json.dumps(finite(data), indent=indent, sort_keys=sort_keys))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a reader sees the old file or the new one, never a mix.

    The bytes reach the disk (fsync) before the rename, so a machine crash cannot leave the new name
    pointing at an empty file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a folder's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float, at any depth, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
