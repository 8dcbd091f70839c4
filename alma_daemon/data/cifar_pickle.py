"""Read the official CIFAR-10 python batches without unpickling them.

The files are pickles of ``{b"data": uint8 ndarray (N, 3072), b"labels": [int], ...}``. Unpickling
untrusted files executes code, so this module walks the opcode stream with :mod:`pickletools`
(which only decodes opcodes and never builds objects) and picks out the pixel bytes and labels.
"""

from __future__ import annotations

import pickletools
from pathlib import Path

import numpy as np

_STRING_OPS = {
    "SHORT_BINSTRING",
    "BINSTRING",
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
    "SHORT_BINBYTES",
    "BINBYTES",
    "BINBYTES8",
    "STRING",
    "UNICODE",
}
_INT_OPS = {"BININT", "BININT1", "BININT2", "INT", "LONG1"}
_PIXELS = 3 * 32 * 32


def read_cifar_python_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)``: uint8 pixels (N, 3072) in CHW order and int64 labels (N)."""
    raw = path.read_bytes()
    data: bytes | None = None
    labels: list[int] = []
    in_labels = False
    for opcode, arg, _ in pickletools.genops(raw):
        if opcode.name in _STRING_OPS:
            assert isinstance(arg, (str, bytes))  # what pickletools decodes these opcodes to
            value = arg.encode("latin-1") if isinstance(arg, str) else arg
            if len(value) >= _PIXELS and len(value) % _PIXELS == 0:
                data = value
            in_labels = value in (b"labels", b"fine_labels")
        elif in_labels and opcode.name in _INT_OPS:
            assert isinstance(arg, int)  # what pickletools decodes these opcodes to (bool for INT's 00 and 01)
            labels.append(int(arg))
    if data is None or not labels:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (no pixel block or no labels found)")
    x = np.frombuffer(data, dtype=np.uint8).reshape(-1, _PIXELS)
    if x.shape[0] != len(labels):
        raise ValueError(f"{path}: {x.shape[0]} images but {len(labels)} labels")
    return x, np.asarray(labels, dtype=np.int64)
