"""Wire codec for chunk records (the format: docs/wire-format.md).

One Kafka record carries one part of one chunk: a safetensors value plus ``alma-*`` headers and the
key ``<stream>/<chunk>``. The producer side (:func:`encode_chunk`) splits a chunk so that every
value stays within the size limit; the consumer side (:func:`decode_record`) treats every record
as untrusted and either returns a fully validated :class:`DecodedPart` or raises
:class:`RejectedRecord` with a reason from the fixed set :data:`REJECT_REASONS`. Records of one or a
few examples without chunk headers (event records) are read by :mod:`alma_daemon.data.events`.

The module is pure logic: no broker, no Redis. Values are never unpickled; safetensors parsing is
done by its Rust deserializer, which only builds plain tensors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeGuard

import safetensors.torch
import torch

from alma_daemon.data.wire_format import (
    CONTENT_TYPE,
    DEFAULT_MAX_PART_BYTES,
    HEADER_CHUNK,
    HEADER_CONTENT_TYPE,
    HEADER_PART,
    HEADER_PARTS,
    HEADER_SCHEMA,
    HEADER_STREAM,
    MAX_ID,
    REJECT_REASONS,
    SCHEMA_VERSION,
    STREAM_NAME_RE,
)

_KNOWN_HEADERS = frozenset({HEADER_SCHEMA, HEADER_STREAM, HEADER_CHUNK, HEADER_PART, HEADER_PARTS, HEADER_CONTENT_TYPE})

_DECIMAL_RE = re.compile(rb"0|[1-9][0-9]{0,15}")

_X_DTYPES: dict[str, torch.dtype] = {"uint8": torch.uint8, "float32": torch.float32}
_LABEL_DTYPE = torch.int64
#: A regression's targets travel as float32 (the dtype the model trains on).
_TARGET_DTYPE = torch.float32
_TOKEN_DTYPE = torch.int32
_LABELED_NAMES = frozenset({"x", "y"})
_TEXT_NAMES = frozenset({"tokens"})

# The size of a part is predicted from a one-item probe encoding; the real header holds the same
# integers (shapes, data offsets) with more digits. Six integers growing by at most 19 digits each
# plus 7 bytes of alignment padding stay far below this allowance.
_HEADER_GROWTH_BYTES = 256


@dataclass(frozen=True)
class WireRecord:
    """One Kafka record: ``key``, ``value`` and headers as kafka-python expects them.

    Chunk parts are keyed ``<stream>/<chunk>``; event records may have no key (None), so that the
    Kafka client spreads them over partitions.
    """

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


@dataclass(frozen=True)
class StreamSchema:
    """What the consumer of one stream accepts.

    ``kind="labeled"``: ``x`` of dtype in ``x_dtypes`` and shape ``(N, *example_shape)``, ``y``
    int64 of shape ``(N,)`` with labels in ``[0, num_classes)``, or, on a ``regression`` stream,
    float32 finite targets. ``kind="text"``: 1-D int32 ``tokens`` in ``[0, vocab_size)``. Fields
    that do not apply to the kind are ignored. ``max_part_bytes`` bounds the length of a record value.
    """

    kind: Literal["labeled", "text"]
    example_shape: tuple[int, ...] = ()
    x_dtypes: tuple[str, ...] = ("uint8", "float32")
    num_classes: int | None = None
    vocab_size: int | None = None
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES
    #: Float ``x`` must be raw pixels in [0, 255] (a task normalized as ``pixels``); else any finite value.
    pixel_range: bool = True
    #: The classes' names in label-index order (``task.classes``): a JSON event may label by name.
    classes: tuple[str, ...] = ()
    #: ``y`` holds a regression's float32 targets, not class indexes (``num_classes`` is then unused).
    regression: bool = False

    def __post_init__(self) -> None:
        # Configs loaded from YAML hand over lists; a frozen dataclass needs tuples to stay hashable.
        object.__setattr__(self, "example_shape", tuple(self.example_shape))
        object.__setattr__(self, "x_dtypes", tuple(self.x_dtypes))
        object.__setattr__(self, "classes", tuple(self.classes))
        if self.kind == "labeled":
            if not all(_is_int(d) and d >= 1 for d in self.example_shape):
                raise ValueError(f"example_shape must hold positive ints; got {self.example_shape!r}")
            if not self.x_dtypes or not set(self.x_dtypes) <= _X_DTYPES.keys():
                raise ValueError(f"x_dtypes must be a non-empty subset of {sorted(_X_DTYPES)}; got {self.x_dtypes!r}")
            if not self.regression and not (_is_int(self.num_classes) and self.num_classes >= 1):
                raise ValueError(f"a labeled stream needs num_classes >= 1; got {self.num_classes!r}")
            self._check_classes()
        elif self.kind == "text":
            if not (_is_int(self.vocab_size) and self.vocab_size >= 1):
                raise ValueError(f"a text stream needs vocab_size >= 1; got {self.vocab_size!r}")
        else:
            raise ValueError(f"kind must be 'labeled' or 'text'; got {self.kind!r}")
        if not (_is_int(self.max_part_bytes) and self.max_part_bytes >= 1):
            raise ValueError(f"max_part_bytes must be a positive int; got {self.max_part_bytes!r}")

    def _check_classes(self) -> None:
        if not self.classes:
            return
        if self.regression:
            raise ValueError("classes name a classifier's labels; a regression stream has none")
        if not all(isinstance(c, str) for c in self.classes) or len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes must be distinct strings; got {list(self.classes)!r:.200}")
        if len(self.classes) != self.num_classes:
            raise ValueError(f"classes name {len(self.classes)} classes, but num_classes is {self.num_classes}")


# eq=False: the generated __eq__ would compare tensors with ``==`` and fail on truth-testing them.
@dataclass(frozen=True, eq=False)
class DecodedPart:
    """One validated part: either labeled ``x``/``y`` or text ``tokens`` (the others are None)."""

    stream: str
    chunk_id: int
    part: int
    parts: int
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    tokens: torch.Tensor | None = None

    @property
    def examples(self) -> int:
        """Examples in this part: rows of ``x``, or tokens for a text stream."""
        if self.tokens is not None:
            return int(self.tokens.shape[0])
        assert self.x is not None
        return int(self.x.shape[0])


class RejectedRecord(Exception):
    """A record that failed validation.

    ``reason`` is one of :data:`REJECT_REASONS` (safe as a Prometheus label value); ``detail`` is a
    human-readable explanation for logs and the dead-letter stream.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}; expected one of {REJECT_REASONS}")
        # Both go to Exception.__init__ so that the exception survives pickling across processes.
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class ChunkOrderGuard:
    """Which chunk ids a stream may still store: a window of ``max_ahead`` ids on each side of the
    newest completed chunk, and no chunk twice.

    Kafka gives no order across partitions, so chunks complete in any order: a chunk older than the
    newest completed one is still valid data (the engine takes it as a late step), and is refused
    only once it falls ``max_ahead`` ids behind, where the set of completed ids that makes a
    re-sent chunk a no-op is no longer kept. Ingest, per record: ``decode_record`` ->
    ``guard.check(stream, chunk_id)`` -> skip the part if ``guard.is_completed`` -> store it; once
    every part of a chunk is stored, ``guard.complete(stream, chunk_id)``. On restart it is seeded
    with the completed ids that Redis holds.

    ``max_ahead`` also bounds a jump: unbounded, one valid record with an id near ``2**53`` would
    complete at once and move the window past every later chunk of the stream. None: no bound, and
    every completed id is kept. Nothing bounds the first chunk of a stream: a producer may start its
    ids anywhere (a replay from a later chunk, ids taken from a clock), and the first chunk sets the
    origin.
    """

    def __init__(self, completed: Mapping[str, Iterable[int]] | None = None, max_ahead: int | None = None) -> None:
        if max_ahead is not None and not (_is_int(max_ahead) and max_ahead >= 1):
            raise ValueError(f"max_ahead must be a positive int or None; got {max_ahead!r}")
        self.max_ahead = max_ahead
        self._completed: dict[str, set[int]] = {}
        self._newest: dict[str, int] = {}
        for stream, ids in (completed or {}).items():
            for chunk_id in ids:
                self.complete(stream, chunk_id)

    def check(self, stream: str, chunk_id: int) -> None:
        """Raise ``RejectedRecord`` "chunk_order" if ``chunk_id`` is below 1 or ``max_ahead`` ids behind the
        newest completed one, "chunk_ahead" if it is more than ``max_ahead`` above it."""
        if chunk_id < 1:
            # The engine's ids start above its initial "last chunk", 0.
            raise RejectedRecord("chunk_order", f"chunk {chunk_id} of stream {stream!r}: chunk ids start at 1")
        newest = self._newest.get(stream)
        if self.max_ahead is None or newest is None:
            return
        if chunk_id - newest > self.max_ahead:
            raise RejectedRecord(
                "chunk_ahead",
                f"chunk {chunk_id} of stream {stream!r} is {chunk_id - newest} ids ahead of chunk {newest}, the "
                f"newest completed; daemon.max_chunks_ahead allows {self.max_ahead} (raise it if the producer "
                f"skips more ids)",
            )
        if newest - chunk_id >= self.max_ahead:
            raise RejectedRecord(
                "chunk_order",
                f"chunk {chunk_id} of stream {stream!r} is {newest - chunk_id} ids behind chunk {newest}, the newest "
                f"completed; daemon.max_chunks_ahead allows {self.max_ahead - 1}",
            )

    def is_completed(self, stream: str, chunk_id: int) -> bool:
        """Whether every part of ``chunk_id`` was stored already (a re-sent part is then a no-op)."""
        return chunk_id in self._completed.get(stream, ())

    def complete(self, stream: str, chunk_id: int) -> None:
        """Record that every part of ``chunk_id`` has been stored."""
        completed = self._completed.setdefault(stream, set())
        completed.add(chunk_id)
        newest = self._newest[stream] = max(chunk_id, self._newest.get(stream, chunk_id))
        if self.max_ahead is not None:
            completed -= {c for c in completed if newest - c >= self.max_ahead}

    def last_completed(self, stream: str) -> int | None:
        """The newest completed chunk id of ``stream``, or None before the first one."""
        return self._newest.get(stream)

    def completed(self, stream: str) -> set[int]:
        """The completed ids of ``stream`` still inside the window (what a restart seeds the guard with)."""
        return set(self._completed.get(stream, ()))

    def behind_window(self, stream: str, chunk_id: int) -> bool:
        """Whether ``chunk_id`` is so far behind the newest completed chunk that its parts are refused."""
        newest = self._newest.get(stream)
        return self.max_ahead is not None and newest is not None and newest - chunk_id >= self.max_ahead


def encode_chunk(
    stream: str,
    chunk_id: int,
    x: torch.Tensor | None = None,
    y: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES,
) -> list[WireRecord]:
    """Encode one chunk as records whose values are at most ``max_part_bytes`` long.

    Pass labeled examples as ``x`` (uint8 or float32, ``N x ...``) and ``y`` (int64 labels or float32
    regression targets, ``N``), or text
    as ``tokens`` (int32, 1-D). The chunk is split along the example (or token) axis into the fewest
    parts that fit (counting a 256-byte allowance for the safetensors header), with part sizes
    differing by at most one example. Raises ValueError on malformed
    input or when a single example cannot fit within ``max_part_bytes``.
    """
    _check_stream_name(stream)
    if not (_is_int(chunk_id) and 0 <= chunk_id <= MAX_ID):
        raise ValueError(f"chunk_id must be an int in [0, {MAX_ID}]; got {chunk_id!r}")
    if not (_is_int(max_part_bytes) and max_part_bytes >= 1):
        raise ValueError(f"max_part_bytes must be a positive int; got {max_part_bytes!r}")
    tensors = _producer_tensors(x, y, tokens)
    n_items = int(next(iter(tensors.values())).shape[0])
    per_item = sum(t[0].numel() * t.element_size() for t in tensors.values())

    def part_tensors(lo: int, hi: int) -> dict[str, torch.Tensor]:
        return {name: t[lo:hi] for name, t in tensors.items()}

    overhead = len(safetensors.torch.save(part_tensors(0, 1))) - per_item + _HEADER_GROWTH_BYTES
    capacity = (max_part_bytes - overhead) // per_item
    if capacity < 1:
        what = "token" if "tokens" in tensors else "example"
        raise ValueError(
            f"one {what} of stream {stream!r} needs {per_item + overhead} bytes with the safetensors "
            f"header, more than max_part_bytes={max_part_bytes}; raise the limit (and Kafka's "
            f"message.max.bytes) or send smaller examples"
        )
    n_parts = math.ceil(n_items / capacity)
    key = _record_key(stream, chunk_id)
    records = []
    for i in range(n_parts):
        lo, hi = i * n_items // n_parts, (i + 1) * n_items // n_parts
        headers = [
            (HEADER_SCHEMA, str(SCHEMA_VERSION).encode()),
            (HEADER_STREAM, stream.encode()),
            (HEADER_CHUNK, str(chunk_id).encode()),
            (HEADER_PART, str(i).encode()),
            (HEADER_PARTS, str(n_parts).encode()),
            (HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
        ]
        records.append(WireRecord(key, safetensors.torch.save(part_tensors(lo, hi)), headers))
    return records


def decode_record(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
    schema: StreamSchema,
    expected_stream: str,
) -> DecodedPart:
    """Validate one record against ``schema`` and return its part.

    Checks run cheapest first: schema version, headers, stream, part numbering, key, value size,
    safetensors parsing, tensor names, dtypes, shapes, label/token range, finiteness. The first
    failure raises :class:`RejectedRecord`. A ValueError means the caller passed an invalid
    ``expected_stream``, not that the record is bad.
    """
    _check_stream_name(expected_stream)
    found = _header_values(headers)

    version = found.get(HEADER_SCHEMA)
    if version is None:
        raise RejectedRecord("schema", f"header {HEADER_SCHEMA!r} is missing")
    if version != str(SCHEMA_VERSION).encode():
        raise RejectedRecord(
            "schema", f"unsupported {HEADER_SCHEMA} {version[:32]!r}; this reader knows {SCHEMA_VERSION}"
        )

    missing = sorted(_KNOWN_HEADERS - found.keys())
    if missing:
        raise RejectedRecord("headers", f"missing headers {missing}")
    if found[HEADER_CONTENT_TYPE] != CONTENT_TYPE.encode():
        raise RejectedRecord("headers", f"content-type {found[HEADER_CONTENT_TYPE][:64]!r}, expected {CONTENT_TYPE!r}")
    try:
        stream = found[HEADER_STREAM].decode("utf-8")
    except UnicodeDecodeError:
        raise RejectedRecord("headers", f"{HEADER_STREAM} is not UTF-8: {found[HEADER_STREAM][:64]!r}") from None
    if stream != expected_stream:
        raise RejectedRecord("stream", f"record of stream {stream[:64]!r} on the consumer of {expected_stream!r}")
    chunk_id = _header_int(found, HEADER_CHUNK)
    part = _header_int(found, HEADER_PART)
    parts = _header_int(found, HEADER_PARTS)
    if parts < 1:
        raise RejectedRecord("part_numbering", f"{HEADER_PARTS} is {parts}; a chunk has at least one part")
    if part >= parts:
        raise RejectedRecord("part_numbering", f"{HEADER_PART} {part} is outside [0, {parts})")
    expected_key = _record_key(stream, chunk_id)
    if key != expected_key:
        shown = key[:96] if isinstance(key, bytes) else key
        raise RejectedRecord("headers", f"key {shown!r} does not match headers (expected {expected_key!r})")

    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise RejectedRecord("decode", f"value is {type(value).__name__}, not bytes")
    value = bytes(value)
    if len(value) > schema.max_part_bytes:
        raise RejectedRecord("size", f"value is {len(value)} bytes; the limit is {schema.max_part_bytes}")
    try:
        tensors = safetensors.torch.load(value)
    except Exception as exc:  # untrusted bytes: whatever the parser trips on, the record is at fault
        raise RejectedRecord("decode", f"value is not a safetensors blob: {exc}") from exc

    expected_names = _LABELED_NAMES if schema.kind == "labeled" else _TEXT_NAMES
    if tensors.keys() != expected_names:
        raise RejectedRecord(
            "decode", f"tensors {sorted(tensors)[:8]} but a {schema.kind} stream carries {sorted(expected_names)}"
        )
    if schema.kind == "labeled":
        _validate_labeled(tensors["x"], tensors["y"], schema)
        return DecodedPart(stream, chunk_id, part, parts, x=tensors["x"], y=tensors["y"])
    _validate_tokens(tensors["tokens"], schema)
    return DecodedPart(stream, chunk_id, part, parts, tokens=tensors["tokens"])


def assemble_chunk(parts: Sequence[DecodedPart]) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Join the parts of one chunk, given in any order, into ``(x, y)`` or ``tokens``.

    A part delivered twice with identical content is accepted once (at-least-once delivery); raises
    ``RejectedRecord("part_numbering")`` when parts are missing, disagree on stream, chunk or part
    count, or a duplicate differs. Parts mixing kinds, ``x`` dtypes or example shapes raise
    "decode", "dtype" or "shape".
    """
    if not parts:
        raise RejectedRecord("part_numbering", "no parts to assemble")
    first = parts[0]
    by_index: dict[int, DecodedPart] = {}
    for p in parts:
        if (p.stream, p.chunk_id, p.parts) != (first.stream, first.chunk_id, first.parts):
            raise RejectedRecord(
                "part_numbering",
                f"part {p.part} says stream {p.stream!r} chunk {p.chunk_id} of {p.parts} parts; part "
                f"{first.part} says stream {first.stream!r} chunk {first.chunk_id} of {first.parts} parts",
            )
        if not 0 <= p.part < p.parts:
            raise RejectedRecord("part_numbering", f"part {p.part} is outside [0, {p.parts})")
        seen = by_index.setdefault(p.part, p)
        if seen is not p and not _same_content(seen, p):
            raise RejectedRecord(
                "part_numbering", f"part {p.part} of chunk {p.chunk_id} delivered twice with different content"
            )
    if len(by_index) != first.parts:
        # The first gap is at most len(by_index), so this scan stays short even for a huge `parts`.
        gap = next(i for i in range(first.parts) if i not in by_index)
        raise RejectedRecord(
            "part_numbering",
            f"chunk {first.chunk_id}: {len(by_index)} of {first.parts} parts present, part {gap} missing",
        )
    ordered = [by_index[i] for i in range(first.parts)]

    if any((p.tokens is None) != (first.tokens is None) for p in ordered):
        raise RejectedRecord("decode", f"chunk {first.chunk_id} mixes labeled and text parts")
    # Every part is of the first one's kind (checked above) and a labeled part holds x and y, so the
    # `is not None` filters drop nothing.
    if first.tokens is not None:
        return torch.cat([p.tokens for p in ordered if p.tokens is not None])
    xs = [p.x for p in ordered if p.x is not None]
    if any(x.dtype != xs[0].dtype for x in xs):
        raise RejectedRecord("dtype", f"chunk {first.chunk_id} mixes x dtypes {sorted({str(x.dtype) for x in xs})}")
    if any(x.shape[1:] != xs[0].shape[1:] for x in xs):
        raise RejectedRecord("shape", f"chunk {first.chunk_id} mixes example shapes")
    return torch.cat(xs), torch.cat([p.y for p in ordered if p.y is not None])


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; True as a chunk id or class count is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_stream_name(stream: object) -> None:
    if not (isinstance(stream, str) and STREAM_NAME_RE.fullmatch(stream)):
        raise ValueError(f"stream name must match {STREAM_NAME_RE.pattern}; got {stream!r}")


def _record_key(stream: str, chunk_id: int) -> bytes:
    return f"{stream}/{chunk_id}".encode()


def _producer_tensors(
    x: torch.Tensor | None, y: torch.Tensor | None, tokens: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Check the producer's input and return CPU, contiguous tensors keyed by wire name."""
    if tokens is not None:
        if x is not None or y is not None:
            raise ValueError("pass either x and y (labeled) or tokens (text), not both")
        if tokens.dtype != _TOKEN_DTYPE or tokens.dim() != 1 or tokens.shape[0] == 0:
            raise ValueError(f"tokens must be non-empty 1-D int32; got {tokens.dtype} {tuple(tokens.shape)}")
        return {"tokens": tokens.detach().cpu().contiguous()}
    if x is None or y is None:
        raise ValueError("pass x and y together (labeled) or tokens alone (text)")
    if x.dtype not in _X_DTYPES.values():
        raise ValueError(f"x must be uint8 or float32; got {x.dtype}")
    if y.dtype not in (_LABEL_DTYPE, _TARGET_DTYPE):
        raise ValueError(f"y must be int64 (class labels) or float32 (regression targets); got {y.dtype}")
    if x.dim() < 1 or x.shape[0] == 0 or 0 in x.shape[1:]:
        raise ValueError(f"x must be N x ... with N >= 1 and no empty example dimension; got {tuple(x.shape)}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"y must have shape ({x.shape[0]},); got {tuple(y.shape)}")
    return {"x": x.detach().cpu().contiguous(), "y": y.detach().cpu().contiguous()}


def _header_values(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """The known headers of a record; unrelated headers (tracing, etc.) are ignored."""
    found: dict[str, bytes] = {}
    try:
        items = list(headers or ())
    except TypeError:
        raise RejectedRecord("headers", f"headers are {type(headers).__name__}, not a list of pairs") from None
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise RejectedRecord("headers", f"header {item!r:.80} is not a (str, bytes) pair")
        name, raw = item
        if name not in _KNOWN_HEADERS:
            continue
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise RejectedRecord("headers", f"header {name!r} has a {type(raw).__name__} value, not bytes")
        if name in found:
            raise RejectedRecord("headers", f"header {name!r} appears more than once")
        found[name] = bytes(raw)
    return found


def _header_int(found: dict[str, bytes], name: str) -> int:
    # Canonical decimal only (no sign, spaces or leading zeros): the key must be reproducible
    # byte-for-byte from the headers.
    raw = found[name]
    if not _DECIMAL_RE.fullmatch(raw) or int(raw) > MAX_ID:
        raise RejectedRecord("headers", f"header {name!r} is {raw[:32]!r}, not a decimal integer in [0, {MAX_ID}]")
    return int(raw)


def _validate_labeled(x: torch.Tensor, y: torch.Tensor, schema: StreamSchema) -> None:
    allowed = {_X_DTYPES[name] for name in schema.x_dtypes}
    if x.dtype not in allowed:
        raise RejectedRecord("dtype", f"x is {x.dtype}; the stream accepts {list(schema.x_dtypes)}")
    if schema.regression and y.dtype != _TARGET_DTYPE:
        raise RejectedRecord("dtype", f"y is {y.dtype}; a regression's targets must be float32")
    if not schema.regression and y.dtype != _LABEL_DTYPE:
        raise RejectedRecord("dtype", f"y is {y.dtype}; labels must be int64")
    if x.dim() != 1 + len(schema.example_shape) or tuple(x.shape[1:]) != schema.example_shape:
        raise RejectedRecord("shape", f"x has shape {tuple(x.shape)}; expected (N, *{schema.example_shape})")
    if x.shape[0] == 0:
        raise RejectedRecord("shape", "part holds no examples")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise RejectedRecord("shape", f"y has shape {tuple(y.shape)}; expected ({x.shape[0]},)")
    if schema.regression:
        if not bool(torch.isfinite(y).all()):
            raise RejectedRecord("non_finite", f"y holds {int((~torch.isfinite(y)).sum())} NaN or infinite targets")
    else:
        low, high = int(y.min()), int(y.max())
        assert schema.num_classes is not None  # StreamSchema requires it of a classifier's stream
        if low < 0 or high >= schema.num_classes:
            raise RejectedRecord("label_range", f"labels span [{low}, {high}]; expected [0, {schema.num_classes})")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise RejectedRecord("non_finite", f"x holds {int((~torch.isfinite(x)).sum())} NaN or infinite values")
    if x.is_floating_point() and schema.pixel_range:
        low_x, high_x = float(x.min()), float(x.max())
        # The model divides raw units by 255 and serving refuses anything outside [0, 255] (normalized
        # features would be misread): a model trained on them could never be published.
        if low_x < 0 or high_x > 255:
            raise RejectedRecord(
                "value_range", f"x spans [{low_x:g}, {high_x:g}]; float x must be raw units in [0, 255]"
            )


def _validate_tokens(tokens: torch.Tensor, schema: StreamSchema) -> None:
    if tokens.dtype != _TOKEN_DTYPE:
        raise RejectedRecord("dtype", f"tokens are {tokens.dtype}; expected int32")
    if tokens.dim() != 1 or tokens.shape[0] == 0:
        raise RejectedRecord("shape", f"tokens have shape {tuple(tokens.shape)}; expected non-empty 1-D")
    low, high = int(tokens.min()), int(tokens.max())
    assert schema.vocab_size is not None  # StreamSchema requires it of a text stream
    # Tokens are the language model's labels (next-token targets), so their range failure shares
    # the "label_range" reason instead of adding a label value used by one stream kind only.
    if low < 0 or high >= schema.vocab_size:
        raise RejectedRecord("label_range", f"tokens span [{low}, {high}]; expected [0, {schema.vocab_size})")


def _same_content(a: DecodedPart, b: DecodedPart) -> bool:
    def same(s: torch.Tensor | None, t: torch.Tensor | None) -> bool:
        if s is None or t is None:
            return s is t
        return s.dtype == t.dtype and s.shape == t.shape and torch.equal(s, t)

    return same(a.x, b.x) and same(a.y, b.y) and same(a.tokens, b.tokens)
