"""The Open Inference Protocol's tensors (OIP, "KServe v2"): read strictly, written as the protocol's JSON.

The protocol carries named tensors: a request ``{"inputs": [{"name", "shape", "datatype", "data"}]}``,
a response ``{"model_name", "model_version", "outputs": [...]}``, ``data`` flat in row-major order.
Requests are read strictly (:func:`tensor_of`), before numpy converts anything: each size at least 1,
data of the tensor's own datatype (no true or "1" for a number, no 1.5 for an integer), a datatype the
model takes; a refusal is one line naming the tensor or feature. What each task kind takes and gives is
its codec's (:mod:`serving.protocols.codecs`).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.protocols.requests import (
    MAX_DEPTH,
    NUMBER_TYPES,
    Nested,
    RequestError,
    check_leaves,
    described,
    nested_lists,
)

#: The protocol's tensor data types and the numpy types they are read as.
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}

#: The datatypes a model of examples or named features takes.
NUMBER_DATATYPES = tuple(datatype for datatype in DATATYPES if datatype not in ("BOOL", "BYTES"))
#: The JSON values each datatype's data may hold, by exact type, and how a refusal says it.
_LEAF_TYPES: dict[str, tuple[frozenset[type], str]] = {
    "BOOL": (frozenset({bool}), "true or false"),
    "BYTES": (frozenset({str}), "strings"),
    **{
        datatype: (frozenset({int}), "integers") if datatype[0] in "UI" else (NUMBER_TYPES, "numbers")
        for datatype in NUMBER_DATATYPES
    },
}
_DATATYPE_OF = {np.dtype(numpy_type): datatype for datatype, numpy_type in DATATYPES.items()}


@dataclass(frozen=True)
class OipTensor:
    """One named tensor of a request or a response; ``data``'s shape is the tensor's."""

    name: str
    datatype: str
    data: np.ndarray

    def to_json(self) -> dict[str, Any]:
        """The tensor as the protocol's JSON carries it (``data`` flat, text as UTF-8 strings)."""
        flat = self.data.reshape(-1).tolist()
        if self.datatype == "BYTES":
            flat = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.data.shape), "data": flat}


def check_datatype(name: str, datatype: Any) -> None:
    """Raise a RequestError naming the tensor where ``datatype`` is not one of the protocol's."""
    if datatype not in DATATYPES:
        raise RequestError(f"{tensor_label(name)}: unknown datatype {_shown(datatype)} (known: {', '.join(DATATYPES)})")


def checked_shape(name: str, shape: Any) -> list[int]:
    """``shape`` if it lists at most :data:`MAX_DEPTH` sizes, each an integer of at least 1; a RequestError
    naming the tensor otherwise (numpy would take -1 as "whatever fits", and no model takes an empty tensor)."""
    if not isinstance(shape, list) or len(shape) > MAX_DEPTH:
        raise RequestError(
            f"{tensor_label(name)}: shape must be a list of at most {MAX_DEPTH} sizes; got {_shown(shape)}"
        )
    odd = next((size for size in shape if type(size) is not int or size < 1), None)
    if odd is not None:
        raise RequestError(
            f"{tensor_label(name)}: shape {_shown(shape)} lists {_shown(odd)}; "
            "each size must be an integer of at least 1"
        )
    return shape


def tensor_of(name: str, shape: Any, datatype: Any, data: Any) -> np.ndarray:
    """The array a JSON tensor describes, its data checked against its datatype before any conversion
    (numpy would read true as 1, 1.5 as 1 for INT64 and "1" as 1.0); a RequestError naming the tensor
    otherwise. ``data`` is flat in row-major order, or nested as ``shape``."""
    what = tensor_label(name)
    check_datatype(name, datatype)
    sizes = checked_shape(name, shape)
    if not isinstance(data, list):
        raise RequestError(f"{what}: data must be a list of values, not {described(data)}")
    nested = nested_lists(data, f"{what}: data")
    _check_fit(what, nested, sizes)
    allowed, wanted = _LEAF_TYPES[datatype]
    check_leaves(nested, allowed, f"{what}: {datatype} data", wanted)
    return _array(what, nested.leaves, datatype).reshape(sizes)


def tensors_of(entries: Any, where: str) -> dict[str, np.ndarray]:
    """The named tensors of a JSON ``inputs`` or ``outputs`` list, each checked against its shape and type."""
    if not isinstance(entries, list) or not entries:
        raise RequestError(f'expected "{where}": a list of tensors {{"name", "shape", "datatype", "data"}}')
    tensors: dict[str, np.ndarray] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not {"name", "shape", "datatype", "data"} <= entry.keys():
            raise RequestError(f'each of "{where}" needs "name", "shape", "datatype" and "data"')
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise RequestError(f'each of "{where}" needs a "name" that is a non-empty string; got {_shown(name)}')
        if name in tensors:  # the second would silently replace the first
            raise RequestError(f"{tensor_label(name)} is given twice")
        tensors[name] = tensor_of(name, entry["shape"], entry["datatype"], entry["data"])
    return tensors


def datatype_of(array: np.ndarray) -> str:
    """The protocol's datatype of ``array`` (BYTES for text, whichever way numpy holds it)."""
    return "BYTES" if array.dtype.kind in "OUS" else _DATATYPE_OF.get(array.dtype, str(array.dtype))


def tensor_label(name: Any) -> str:
    """How a refusal names a tensor of a request (its name cut to 64 characters)."""
    return f"tensor {str(name)[:64]!r}"


def _shown(value: Any) -> str:
    """A short text for a value out of a request: a shape or datatype may be anything a client sent."""
    return reprlib.repr(value)


def _check_fit(what: str, nested: Nested, sizes: list[int]) -> None:
    """Raise a RequestError where data does not hold as many values as ``sizes`` or is nested otherwise."""
    # At most MAX_DEPTH sizes, each a JSON integer: their product is quick to compute, however large.
    if len(nested.leaves) != math.prod(sizes):
        raise RequestError(
            f"{what}: data does not fit its shape and datatype: {len(nested.leaves)} values for shape {_shown(sizes)}"
        )
    if len(nested.shape) > 1 and nested.shape != sizes:
        raise RequestError(f"{what}: data is nested as {nested.shape}, neither flat nor as its shape {sizes}")


def _array(what: str, leaves: list[Any], datatype: str) -> np.ndarray:
    """``leaves`` (of the types ``datatype`` allows) as numpy's type for ``datatype``."""
    try:
        # A float beyond FP16 or FP32 becomes infinite: the examples' check refuses it, with its own words.
        with np.errstate(over="ignore"):
            return np.array(leaves, dtype=DATATYPES[datatype])
    except OverflowError as err:  # an integer beyond its type: "Python integer 300 out of bounds for uint8"
        raise RequestError(f"{what}: data does not fit its shape and datatype: {err}") from None


def request_body(*tensors: OipTensor, parameters: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON request holding ``tensors``."""
    body: dict[str, Any] = {"inputs": [t.to_json() for t in tensors]}
    if parameters:
        body["parameters"] = dict(parameters)
    return body


def check_numbers(what: str, array: np.ndarray) -> None:
    """Raise a RequestError naming ``what`` where ``array`` is not of a number datatype (a model of
    examples or features reads no text, and true is no number)."""
    datatype = datatype_of(array)
    if datatype not in NUMBER_DATATYPES:
        raise RequestError(f"{what} must be numbers, not {datatype} (send FP32, UINT8 or another number type)")
