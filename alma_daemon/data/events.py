"""Wire codec for event records (the format: docs/wire-format.md, "Event records").

An event record carries one labeled example, or a few, with no chunk headers: the daemon cuts the
stream of examples into chunks itself. Its ``content-type`` header says how the value is written:

- :data:`EVENT_JSON`: a JSON object, ``{"x": [...], "y": 3}`` for one example, ``{"x": [ex, ...],
  "y": [3, ...]}`` for a few, or named numeric fields (``{"age": 31, "income": 2.5, "y": 1}``) when
  the stream declares its ``features``; a label is a class index or, where the task names its
  classes, a name (``"y": "fraud"``); a regression's target is a number;
- :data:`EVENT_ROWS`: a safetensors blob with ``x`` ``(N, *example_shape)`` and ``y`` ``(N,)`` (int64
  labels, float32 regression targets), validated like a chunk part.

The key is not read: producers use it for partitioning or leave it empty. :func:`decode_event`
treats every record as untrusted and returns validated ``(x, y)`` or raises
:class:`~alma_daemon.data.wire.RejectedRecord`, with the reasons and the value checks of chunk parts
(one rule for both, ``wire._validate_labeled``) plus ``fields`` for a JSON object whose field names
are not the expected ones. :func:`named_features` reads named fields for serving too, so the
endpoint takes what the wire takes. :func:`encode_events` is the producer side. The module is pure
logic: no broker, no Redis, and values are never unpickled.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import safetensors.torch
import torch

from alma_daemon.data.wire import (
    RejectedRecord,
    StreamSchema,
    WireRecord,
    _is_int,
    _producer_tensors,
    _validate_labeled,
)
from alma_daemon.data.wire_format import (
    DEFAULT_MAX_PART_BYTES,
    EVENT_CONTENT_TYPES,
    EVENT_JSON,
    EVENT_ROWS,
    HEADER_CONTENT_TYPE,
)

_NUMBER_TYPES = frozenset({int, float})


def decode_event(
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
    schema: StreamSchema,
    features: Sequence[str] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate one event record against ``schema`` and return ``(x, y)``.

    ``x`` has shape ``(n, *schema.example_shape)`` (float32 from JSON, as sent from safetensors rows)
    and ``y`` is ``(n,)``, ``n >= 1``: int64 class indexes (a JSON label given by name is mapped to
    its index in ``schema.classes``), or float32 targets on a regression stream. ``features`` names
    the numeric fields of a JSON event, in input order (``schema.example_shape`` is then
    ``(len(features),)``). Checks run cheapest first: content type, value size (before any
    parsing), decoding, field names, dtypes, shapes, label range, finiteness, value range; the first
    failure raises :class:`RejectedRecord`. A ValueError means the caller passed a schema or
    features that no event can match.
    """
    features = _check_features(features, schema)
    content_type = _content_type(headers)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise RejectedRecord("decode", f"value is {type(value).__name__}, not bytes")
    if len(value) > schema.max_part_bytes:
        raise RejectedRecord("size", f"value is {len(value)} bytes; the limit is {schema.max_part_bytes}")
    if content_type == EVENT_ROWS:
        x, y = _rows(bytes(value))
    else:
        x, y = _json_event(bytes(value), schema, features)
    _validate_labeled(x, y, schema)
    return x, y


def encode_events(
    x: torch.Tensor,
    y: torch.Tensor,
    content_type: str = EVENT_JSON,
    features: Sequence[str] = (),
    per_record: int = 1,
    key: bytes | None = None,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
) -> list[WireRecord]:
    """Encode examples ``x`` (uint8 or float32, ``N x ...``) and labels ``y`` (int64, ``N``; float32
    for a regression's targets) as event records of ``per_record`` examples each (the last one may
    hold fewer), in order.

    JSON records hold one example in the single form when ``per_record == 1`` and the list form
    otherwise; ``x`` is written flat (uint8 as integers, float32 exactly), or as the named fields
    ``features`` (then ``x`` is ``N x len(features)``). Every record gets ``key`` (None: the Kafka
    client spreads records over partitions). The same input gives byte-identical records. Raises
    ValueError on malformed input, a non-finite float, or a record longer than ``max_part_bytes``.
    """
    if content_type not in EVENT_CONTENT_TYPES:
        raise ValueError(f"content_type must be one of {EVENT_CONTENT_TYPES}; got {content_type!r}")
    if not (_is_int(per_record) and per_record >= 1):
        raise ValueError(f"per_record must be a positive int; got {per_record!r}")
    tensors = _producer_tensors(x, y, None)
    x, y = tensors["x"], tensors["y"]
    features = tuple(features)
    if features and (content_type != EVENT_JSON or x.dim() != 2 or x.shape[1] != len(features)):
        raise ValueError(f"features name the columns of a JSON event's N x {len(features)} x; got {tuple(x.shape)}")
    headers = [(HEADER_CONTENT_TYPE, content_type.encode())]
    records = []
    for lo in range(0, x.shape[0], per_record):
        xs, ys = x[lo : lo + per_record], y[lo : lo + per_record]
        if content_type == EVENT_ROWS:
            value = safetensors.torch.save({"x": xs, "y": ys})
        else:
            value = _json_value(xs, ys, features, single=per_record == 1)
        if len(value) > max_part_bytes:
            raise ValueError(
                f"an event record of {xs.shape[0]} example(s) is {len(value)} bytes, more than "
                f"max_part_bytes={max_part_bytes}; send fewer examples per record"
            )
        records.append(WireRecord(key, value, list(headers)))
    return records


def _check_features(features: Sequence[str], schema: StreamSchema) -> tuple[str, ...]:
    if schema.kind != "labeled":
        raise ValueError(f"event records carry labeled examples; the stream is {schema.kind}")
    names = tuple(features)
    if names and (schema.example_shape != (len(names),) or len(set(names)) != len(names) or "y" in names):
        raise ValueError(
            f"features {list(names)} must be distinct, not 'y', and match example_shape {schema.example_shape}"
        )
    return names


def _content_type(headers: Iterable[tuple[str, bytes | None]] | None) -> str:
    """The record's content type; other headers are ignored."""
    try:
        items = list(headers or ())
    except TypeError:
        raise RejectedRecord("headers", f"headers are {type(headers).__name__}, not a list of pairs") from None
    found = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise RejectedRecord("headers", f"header {item!r:.80} is not a (str, bytes) pair")
        if item[0] == HEADER_CONTENT_TYPE:
            found.append(item[1])
    if len(found) != 1:
        raise RejectedRecord("headers", f"header {HEADER_CONTENT_TYPE!r} appears {len(found)} times; expected once")
    raw = found[0]
    for known in EVENT_CONTENT_TYPES:
        if raw == known.encode():
            return known
    shown = raw[:64] if isinstance(raw, (bytes, bytearray, memoryview)) else type(raw).__name__
    raise RejectedRecord("headers", f"content-type {shown!r}; an event record is one of {list(EVENT_CONTENT_TYPES)}")


def _rows(value: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        tensors = safetensors.torch.load(value)
    except Exception as exc:  # untrusted bytes: whatever the parser trips on, the record is at fault
        raise RejectedRecord("decode", f"value is not a safetensors blob: {exc}") from exc
    if tensors.keys() != {"x", "y"}:
        raise RejectedRecord("decode", f"tensors {sorted(tensors)[:8]} but event rows carry ['x', 'y']")
    return tensors["x"], tensors["y"]


def _reject_constant(name: str) -> Any:
    # Python's json reads NaN and ±Infinity, which JSON itself (RFC 8259) does not have.
    raise RejectedRecord("non_finite", f"{name} is not a JSON number")


def _json_event(value: bytes, schema: StreamSchema, features: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        doc = json.loads(value.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RejectedRecord("decode", f"value is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RejectedRecord("decode", f"value is a JSON {type(doc).__name__}, not an object")
    expected = {*features, "y"} if features else {"x", "y"}
    if doc.keys() != expected:
        missing, extra = sorted(expected - doc.keys()), sorted(doc.keys() - expected)
        raise RejectedRecord("fields", f"fields missing {missing[:8]}, unexpected {[k[:64] for k in extra[:8]]}")

    few, labels = _labels(doc["y"], schema)
    n = len(labels)
    if n == 0:
        raise RejectedRecord("shape", "the event holds no examples")

    if features:
        x = named_features(doc, features, n if few else None)
    else:
        shape = schema.example_shape
        x_doc = doc["x"] if few else [doc["x"]]
        flat, nested = (n, math.prod(shape)), (n, *shape)
        numbers = _leaves(x_doc, flat)
        if numbers is None and nested != flat:
            numbers = _leaves(x_doc, nested)
        if numbers is None:
            each = f"{n} examples, each" if few else "x"
            raise RejectedRecord("shape", f"{each} must be {flat[1]} numbers, flat or nested as {shape}")
        x = _float32(numbers).reshape(nested)
    if schema.regression:
        return x, _float32(labels)
    try:
        y = torch.tensor(labels, dtype=torch.int64)
    except (ValueError, OverflowError, RuntimeError):
        raise RejectedRecord("label_range", "a label does not fit in int64") from None
    return x, y


def named_features(doc: Mapping[str, Any], features: tuple[str, ...], n: int | None) -> torch.Tensor:
    """The examples of a JSON object's named fields ``features`` (all present), float32 ``n x F`` in
    the order of ``features``: each field a number (``n`` None: one example) or a list of ``n`` numbers.

    Raises :class:`RejectedRecord` naming the first field at fault: "dtype" for one holding something
    other than numbers (a string, a bool, null), "shape" for one of another form.
    """
    # Columns, one per feature: (F,) for one example, (F, n) for a few.
    columns = [doc[name] for name in features]
    try:
        numbers = _leaves(columns, (len(features),) if n is None else (len(features), n))
    except RejectedRecord:
        numbers = None
    if numbers is None:
        raise _misfit_field(doc, features, n)
    count = 1 if n is None else n
    return _float32(numbers).reshape(len(features), count).T.contiguous()


def _misfit_field(doc: Mapping[str, Any], features: tuple[str, ...], n: int | None) -> RejectedRecord:
    """Why the fields ``features`` of ``doc``, which :func:`_leaves` refused, are not examples: the
    first field holding something other than numbers ("dtype"), else the first of another form ("shape")."""
    form = "a number (one example)" if n is None else f"a list of {n} numbers, one per example"

    def items(value: Any) -> list[Any]:
        return value if type(value) is list else [value]

    def fits(value: Any) -> bool:
        if n is None:
            return type(value) in _NUMBER_TYPES
        return type(value) is list and len(value) == n and set(map(type, value)) <= _NUMBER_TYPES

    odd = next((name for name in features if not set(map(type, items(doc[name]))) <= {*_NUMBER_TYPES, list}), None)
    if odd is not None:
        return RejectedRecord("dtype", f"field {odd[:64]!r} is {json.dumps(doc[odd])[:64]}, not {form}")
    misfit = next(name for name in features if not fits(doc[name]))
    return RejectedRecord("shape", f"field {misfit[:64]!r} is {json.dumps(doc[misfit])[:64]}, not {form}")


def _labels(labels: Any, schema: StreamSchema) -> tuple[bool, list[Any]]:
    """(whether ``y`` is a list, its labels): class indexes (names mapped to them), or numbers on a
    regression stream."""
    few = type(labels) is list
    items = labels if few else [labels]
    kinds = set(map(type, items))
    if schema.regression:
        if not kinds <= _NUMBER_TYPES:
            raise RejectedRecord("dtype", f"y is {json.dumps(labels)[:64]}; a regression's targets are numbers")
        return few, items
    if str in kinds and schema.classes:
        index = _class_indexes(schema.classes)
        for label in items:
            if type(label) is str and label not in index:
                raise RejectedRecord(
                    "label_range", f"label {label[:64]!r} is not a class; the classes are {_listed(schema.classes)}"
                )
        items = [index[label] if type(label) is str else label for label in items]
        kinds = set(map(type, items))
    if not kinds <= {int}:
        what = "class indexes or names" if schema.classes else "integers (task.classes would let them be names)"
        raise RejectedRecord("dtype", f"y is {json.dumps(labels)[:64]}; labels are {what}, or a list of them")
    return few, items


@functools.lru_cache(maxsize=16)
def _class_indexes(classes: tuple[str, ...]) -> dict[str, int]:
    return {name: i for i, name in enumerate(classes)}


def _listed(classes: tuple[str, ...], most: int = 20) -> str:
    shown = ", ".join(c[:64] for c in classes[:most])
    return shown if len(classes) <= most else f"{shown} and {len(classes) - most} more"


def _leaves(doc: Any, shape: tuple[int, ...]) -> list[Any] | None:
    """The numbers of ``doc`` in order if it is nested exactly as ``shape``, else None.

    One level at a time, with C-level ``map``/``chain`` over the items: an MNIST event stays well
    under a millisecond. A leaf that is neither int nor float (bool, string, null) is a "dtype".
    """
    level = [doc]
    for size in shape:
        if set(map(type, level)) != {list} or set(map(len, level)) != {size}:
            return None
        level = list(chain.from_iterable(level))
    kinds = set(map(type, level))
    if list in kinds or dict in kinds:
        return None
    if not kinds <= _NUMBER_TYPES:
        raise RejectedRecord("dtype", f"x holds {sorted(k.__name__ for k in kinds - _NUMBER_TYPES)}, not numbers")
    return level


def _float32(numbers: list[Any]) -> torch.Tensor:
    # Through float64: numpy warns when it casts a float beyond float32 range, torch makes it inf,
    # which the shared check rejects as non_finite.
    try:
        wide = np.array(numbers, dtype=np.float64)
    except OverflowError:
        raise RejectedRecord("non_finite", "a number is beyond the float range") from None
    return torch.from_numpy(wide).to(torch.float32)


def _json_value(x: torch.Tensor, y: torch.Tensor, features: tuple[str, ...], single: bool) -> bytes:
    rows, labels = x.reshape(x.shape[0], -1).tolist(), y.tolist()
    doc: dict[str, Any]
    if features:
        columns = list(zip(*rows))
        doc = {name: column[0] if single else list(column) for name, column in zip(features, columns)}
        doc["y"] = labels[0] if single else labels
    else:
        doc = {"x": rows[0], "y": labels[0]} if single else {"x": rows, "y": labels}
    # allow_nan=False: NaN and Infinity are not JSON, and the daemon rejects them anyway.
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
