"""Wire codec: round trips, part sizes, and one concrete bad record for every rejection reason."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import pickle
import pickletools
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import safetensors.torch
import torch

from alma_daemon.data.wire import (
    CONTENT_TYPE,
    DEFAULT_MAX_PART_BYTES,
    MAX_ID,
    REJECT_REASONS,
    SCHEMA_VERSION,
    ChunkOrderGuard,
    DecodedPart,
    RejectedRecord,
    StreamSchema,
    WireRecord,
    assemble_chunk,
    decode_record,
    encode_chunk,
)

MNIST = StreamSchema(kind="labeled", example_shape=(28, 28), num_classes=10)
CIFAR = StreamSchema(kind="labeled", example_shape=(32, 32, 3), num_classes=10)
FEATURES = StreamSchema(kind="labeled", example_shape=(8,), x_dtypes=("float32",), num_classes=3)
TEXT = StreamSchema(kind="text", vocab_size=1000)
CIFAR_EXAMPLE_BYTES = 32 * 32 * 3 + 8


def labeled(n: int, shape: tuple[int, ...], seed: int = 0, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    return x, torch.randint(0, classes, (n,), generator=g)


def text(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TEXT.vocab_size, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))


def decode(record: WireRecord, schema: StreamSchema = MNIST, stream: str = "mnist") -> DecodedPart:
    return decode_record(record.key, record.value, record.headers, schema, stream)


def headers_for(stream: str, chunk: int, part: int = 0, parts: int = 1) -> list[tuple[str, bytes]]:
    return [
        ("alma-schema", b"1"),
        ("alma-stream", stream.encode()),
        ("alma-chunk", str(chunk).encode()),
        ("alma-part", str(part).encode()),
        ("alma-parts", str(parts).encode()),
        ("content-type", CONTENT_TYPE.encode()),
    ]


def raw(tensors: dict[str, torch.Tensor], stream: str = "mnist", chunk: int = 7) -> WireRecord:
    """A record built by hand, bypassing the encoder's own input checks."""
    return WireRecord(f"{stream}/{chunk}".encode(), safetensors.torch.save(tensors), headers_for(stream, chunk))


def good() -> WireRecord:
    x, y = labeled(4, (28, 28))
    return encode_chunk("mnist", 7, x, y)[0]


def set_header(record: WireRecord, name: str, value: bytes | None) -> WireRecord:
    return dataclasses.replace(record, headers=[(k, value if k == name else v) for k, v in record.headers])


def with_extra_header(*extra: tuple) -> WireRecord:
    record = good()
    return dataclasses.replace(record, headers=record.headers + list(extra))


def drop_header(record: WireRecord, name: str) -> WireRecord:
    return dataclasses.replace(record, headers=[(k, v) for k, v in record.headers if k != name])


def mnist_x(shape: tuple[int, ...] = (4, 28, 28), dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def mnist_y(values: list[int] | None = None, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values if values is not None else [0, 1, 2, 3], dtype=dtype)


def float_record(value: float) -> WireRecord:
    x = torch.zeros(2, 8)
    x[1, 3] = value
    return raw({"x": x, "y": torch.tensor([0, 2])}, stream="feat")


def pickle_payload() -> bytes:
    x, y = labeled(4, (28, 28))
    return pickle.dumps({"x": x, "y": y})


def torch_save_payload() -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(zip("xy", labeled(4, (28, 28)))), buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class Case:
    build: Callable[[], WireRecord]
    reason: str
    schema: StreamSchema = MNIST
    stream: str = "mnist"


CASES: dict[str, Case] = {
    # schema
    "schema-missing": Case(lambda: drop_header(good(), "alma-schema"), "schema"),
    "schema-no-headers-at-all": Case(lambda: dataclasses.replace(good(), headers=None), "schema"),
    "schema-future-version": Case(lambda: set_header(good(), "alma-schema", b"2"), "schema"),
    "schema-garbled": Case(lambda: set_header(good(), "alma-schema", b"v1"), "schema"),
    # headers and key
    "headers-chunk-missing": Case(lambda: drop_header(good(), "alma-chunk"), "headers"),
    "headers-duplicate": Case(lambda: with_extra_header(("alma-part", b"0")), "headers"),
    "headers-value-none": Case(lambda: set_header(good(), "alma-part", None), "headers"),
    "headers-not-a-pair": Case(lambda: with_extra_header(("alma-part",)), "headers"),
    "headers-not-a-list": Case(lambda: dataclasses.replace(good(), headers=42), "headers"),
    "headers-chunk-leading-zero": Case(lambda: set_header(good(), "alma-chunk", b"07"), "headers"),
    "headers-chunk-negative": Case(lambda: set_header(good(), "alma-chunk", b"-7"), "headers"),
    "headers-chunk-above-2**53": Case(lambda: set_header(good(), "alma-chunk", b"9007199254740992"), "headers"),
    "headers-parts-not-a-number": Case(lambda: set_header(good(), "alma-parts", b"one"), "headers"),
    "headers-content-type": Case(lambda: set_header(good(), "content-type", b"application/octet-stream"), "headers"),
    "headers-stream-not-utf8": Case(lambda: set_header(good(), "alma-stream", b"\xff\xfe"), "headers"),
    "headers-key-other-chunk": Case(lambda: dataclasses.replace(good(), key=b"mnist/8"), "headers"),
    "headers-key-missing": Case(lambda: dataclasses.replace(good(), key=None), "headers"),
    # stream
    "stream-other-stream": Case(lambda: encode_chunk("cifar", 7, *labeled(4, (28, 28)))[0], "stream"),
    # part numbering
    "part_numbering-part-equals-parts": Case(lambda: set_header(good(), "alma-part", b"1"), "part_numbering"),
    "part_numbering-zero-parts": Case(lambda: set_header(good(), "alma-parts", b"0"), "part_numbering"),
    # size
    "size-over-schema-limit": Case(good, "size", schema=dataclasses.replace(MNIST, max_part_bytes=1024)),
    "size-producer-limit-too-high": Case(
        lambda: encode_chunk("cifar", 1, *labeled(400, (32, 32, 3)), max_part_bytes=2 << 20)[0], "size", CIFAR, "cifar"
    ),
    # decode
    "decode-garbage": Case(lambda: dataclasses.replace(good(), value=b"definitely not safetensors"), "decode"),
    "decode-empty": Case(lambda: dataclasses.replace(good(), value=b""), "decode"),
    "decode-tombstone": Case(lambda: dataclasses.replace(good(), value=None), "decode"),
    "decode-truncated": Case(lambda: dataclasses.replace(good(), value=good().value[:-1]), "decode"),
    "decode-pickle": Case(lambda: dataclasses.replace(good(), value=pickle_payload()), "decode"),
    "decode-torch-save": Case(lambda: dataclasses.replace(good(), value=torch_save_payload()), "decode"),
    "decode-extra-tensor": Case(lambda: raw({"x": mnist_x(), "y": mnist_y(), "z": torch.zeros(1)}), "decode"),
    "decode-missing-y": Case(lambda: raw({"x": mnist_x()}), "decode"),
    "decode-text-on-labeled-stream": Case(lambda: encode_chunk("mnist", 7, tokens=text(10))[0], "decode"),
    "decode-labeled-on-text-stream": Case(
        lambda: encode_chunk("ptb", 7, *labeled(4, (28, 28)))[0], "decode", TEXT, "ptb"
    ),
    # dtype
    "dtype-x-float64": Case(lambda: raw({"x": mnist_x(dtype=torch.float64), "y": mnist_y()}), "dtype"),
    "dtype-x-int16": Case(lambda: raw({"x": mnist_x(dtype=torch.int16), "y": mnist_y()}), "dtype"),
    "dtype-x-not-allowed-by-schema": Case(
        lambda: raw({"x": torch.zeros(2, 8, dtype=torch.uint8), "y": torch.tensor([0, 1])}, stream="feat"),
        "dtype",
        FEATURES,
        "feat",
    ),
    "dtype-y-int32": Case(lambda: raw({"x": mnist_x(), "y": mnist_y(dtype=torch.int32)}), "dtype"),
    "dtype-tokens-int64": Case(lambda: raw({"tokens": text(10).long()}, stream="ptb"), "dtype", TEXT, "ptb"),
    # shape
    "shape-example-shape": Case(lambda: raw({"x": mnist_x((4, 28, 27)), "y": mnist_y()}), "shape"),
    "shape-flattened-x": Case(lambda: raw({"x": mnist_x((4, 784)), "y": mnist_y()}), "shape"),
    "shape-y-length": Case(lambda: raw({"x": mnist_x(), "y": mnist_y([0, 1, 2])}), "shape"),
    "shape-y-2d": Case(lambda: raw({"x": mnist_x(), "y": mnist_y().reshape(4, 1)}), "shape"),
    "shape-no-examples": Case(lambda: raw({"x": mnist_x((0, 28, 28)), "y": mnist_y([])}), "shape"),
    "shape-tokens-2d": Case(lambda: raw({"tokens": text(10).reshape(2, 5)}, stream="ptb"), "shape", TEXT, "ptb"),
    "shape-tokens-empty": Case(lambda: raw({"tokens": text(0)}, stream="ptb"), "shape", TEXT, "ptb"),
    # label range
    "label_range-y-equals-num-classes": Case(lambda: raw({"x": mnist_x(), "y": mnist_y([0, 1, 10, 3])}), "label_range"),
    "label_range-y-negative": Case(lambda: raw({"x": mnist_x(), "y": mnist_y([0, -1, 2, 3])}), "label_range"),
    "label_range-token-equals-vocab": Case(
        lambda: raw({"tokens": torch.tensor([1, 1000], dtype=torch.int32)}, stream="ptb"), "label_range", TEXT, "ptb"
    ),
    "label_range-token-negative": Case(
        lambda: raw({"tokens": torch.tensor([1, -5], dtype=torch.int32)}, stream="ptb"), "label_range", TEXT, "ptb"
    ),
    # non-finite
    "non_finite-nan": Case(lambda: float_record(float("nan")), "non_finite", FEATURES, "feat"),
    "non_finite-inf": Case(lambda: float_record(float("inf")), "non_finite", FEATURES, "feat"),
    "non_finite-minus-inf": Case(lambda: float_record(float("-inf")), "non_finite", FEATURES, "feat"),
    # raw units
    "value_range-negative": Case(lambda: float_record(-0.5), "value_range", FEATURES, "feat"),
    "value_range-above-255": Case(lambda: float_record(255.5), "value_range", FEATURES, "feat"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_record_is_rejected_with_its_reason(name: str) -> None:
    case = CASES[name]
    record = case.build()
    with pytest.raises(RejectedRecord) as caught:
        decode_record(record.key, record.value, record.headers, case.schema, case.stream)
    assert caught.value.reason == case.reason, caught.value.detail
    assert caught.value.detail


def test_every_reason_has_a_concrete_bad_record() -> None:
    # chunk_order and chunk_ahead need state across records and are covered by the ChunkOrderGuard tests;
    # fields is an event's reason (tests/test_events.py); incomplete is a chunk's, given up by ingest
    # (tests/test_incomplete_chunks.py).
    covered = {case.reason for case in CASES.values()} | {"chunk_order", "chunk_ahead", "fields", "incomplete"}
    assert covered == set(REJECT_REASONS)
    assert all(name.split("-")[0] == case.reason for name, case in CASES.items())


# A pickle whose loading would call this function: the proof that nothing unpickled it.
UNPICKLED: list[str] = []


def _record_unpickling(tag: str) -> None:
    UNPICKLED.append(tag)


class _Exploit:
    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return _record_unpickling, ("unpickled",)


def test_pickle_payload_is_rejected_and_never_unpickled() -> None:
    payload = pickle.dumps(_Exploit())
    # The payload is live (unpickling it would call _record_unpickling), shown without unpickling it.
    opcodes = [(op.name, arg) for op, arg, _ in pickletools.genops(payload)]
    assert "_record_unpickling" in {arg for _, arg in opcodes} and "REDUCE" in {name for name, _ in opcodes}
    record = dataclasses.replace(good(), value=payload)
    with pytest.raises(RejectedRecord) as caught:
        decode(record)
    assert caught.value.reason == "decode"
    assert UNPICKLED == []


def test_values_are_safetensors_not_pickle() -> None:
    value = good().value
    header_len = int.from_bytes(value[:8], "little")
    assert value[8:9] == b"{" and header_len < len(value)
    assert set(safetensors.torch.load(value)) == {"x", "y"}


def test_mnist_round_trip_is_one_part_with_exact_headers() -> None:
    x, y = labeled(100, (28, 28))
    records = encode_chunk("mnist", 12, x, y)
    assert len(records) == 1
    record = records[0]
    assert record.key == b"mnist/12"
    assert record.headers == [
        ("alma-schema", str(SCHEMA_VERSION).encode()),
        ("alma-stream", b"mnist"),
        ("alma-chunk", b"12"),
        ("alma-part", b"0"),
        ("alma-parts", b"1"),
        ("content-type", b"application/vnd.alma.safetensors"),
    ]
    part = decode(record)
    assert (part.stream, part.chunk_id, part.part, part.parts, part.examples) == ("mnist", 12, 0, 1, 100)
    x2, y2 = assemble_chunk([part])
    assert x2.dtype == torch.uint8 and torch.equal(x2, x) and torch.equal(y2, y)


def test_cifar_chunk_splits_into_fewest_parts_under_900_kib() -> None:
    x, y = labeled(1000, (32, 32, 3), seed=1)
    records = encode_chunk("cifar", 3, x, y)
    assert len(records) == math.ceil(1000 * CIFAR_EXAMPLE_BYTES / DEFAULT_MAX_PART_BYTES) == 4
    assert all(len(r.value) <= DEFAULT_MAX_PART_BYTES for r in records)
    assert {r.key for r in records} == {b"cifar/3"}
    parts = [decode(r, CIFAR, "cifar") for r in records]
    assert [(p.part, p.parts) for p in parts] == [(i, 4) for i in range(4)]
    assert max(p.examples for p in parts) - min(p.examples for p in parts) <= 1
    x2, y2 = assemble_chunk(parts)
    assert torch.equal(x2, x) and torch.equal(y2, y)


def test_cifar_split_boundary_near_900_kib() -> None:
    fits = (DEFAULT_MAX_PART_BYTES - 1024) // CIFAR_EXAMPLE_BYTES
    one = encode_chunk("cifar", 1, *labeled(fits, (32, 32, 3)))
    assert len(one) == 1
    assert DEFAULT_MAX_PART_BYTES - 2 * CIFAR_EXAMPLE_BYTES < len(one[0].value) <= DEFAULT_MAX_PART_BYTES
    too_many = DEFAULT_MAX_PART_BYTES // CIFAR_EXAMPLE_BYTES + 1
    two = encode_chunk("cifar", 1, *labeled(too_many, (32, 32, 3)))
    assert len(two) == 2 and all(len(r.value) <= DEFAULT_MAX_PART_BYTES for r in two)


def test_parts_never_exceed_the_limit_when_data_nearly_fills_it() -> None:
    # Sweeping one example's worth of limits against chunks that just fit or just overflow makes
    # the size prediction meet the limit exactly somewhere; an underestimated header shows up here.
    example_bytes = 9 * 4 + 8
    x, y = torch.zeros(3000, 9), torch.zeros(3000, dtype=torch.int64)
    for limit in range(100_000, 100_000 + example_bytes):
        for n in range(limit // example_bytes - 12, limit // example_bytes + 1):
            records = encode_chunk("feat", 123456789, x[:n], y[:n], max_part_bytes=limit)
            assert max(len(r.value) for r in records) <= limit, (limit, n)


@pytest.mark.parametrize("limit", [700, 1000, 4096, 65536])
def test_float32_round_trip_and_part_sizes(limit: int) -> None:
    g = torch.Generator().manual_seed(limit)
    x = torch.rand(300, 8, generator=g) * 255  # raw units, the range the wire accepts
    x[0, 0] = -0.0
    y = torch.randint(0, 3, (300,), generator=g)
    records = encode_chunk("feat", 5, x, y, max_part_bytes=limit)
    assert all(len(r.value) <= limit for r in records)
    schema = dataclasses.replace(FEATURES, max_part_bytes=limit)
    parts = [decode(r, schema, "feat") for r in records]
    assert sum(p.examples for p in parts) == 300
    x2, y2 = assemble_chunk(parts)
    assert x2.dtype == torch.float32 and torch.equal(x2, x) and torch.equal(y2, y)
    assert torch.equal(x2.view(torch.int32), x.view(torch.int32)), "bit-exact, including -0.0"


def test_a_regressions_chunk_carries_float32_targets_and_refuses_non_finite_ones() -> None:
    schema = StreamSchema(kind="labeled", example_shape=(8,), pixel_range=False, regression=True)
    x, y = torch.randn(300, 8) * 1e3, torch.randn(300) * 50
    records = encode_chunk("amount", 3, x, y, max_part_bytes=4096)
    assert len(records) > 1
    x2, y2 = assemble_chunk([decode(r, schema, "amount") for r in records])
    assert y2.dtype == torch.float32 and torch.equal(y2, y) and torch.equal(x2, x)

    y[7] = float("nan")
    with pytest.raises(RejectedRecord, match="non_finite: y holds 1 NaN or infinite targets"):
        decode(encode_chunk("amount", 3, x[:10], y[:10])[0], schema, "amount")
    with pytest.raises(RejectedRecord, match="dtype: y is torch.int64; a regression's targets must be float32"):
        decode(encode_chunk("amount", 3, x[:10], torch.arange(10))[0], schema, "amount")
    with pytest.raises(RejectedRecord, match="dtype: y is torch.float32; labels must be int64"):
        decode(encode_chunk("feat", 3, x[:10].abs() % 255, y[:10].nan_to_num())[0], FEATURES, "feat")


def test_text_round_trip_split_along_tokens() -> None:
    tokens = text(10_000, seed=3)
    records = encode_chunk("ptb", 9, tokens=tokens, max_part_bytes=4096)
    assert len(records) > 9 and all(len(r.value) <= 4096 for r in records)
    parts = [decode(r, TEXT, "ptb") for r in records]
    assert sum(p.examples for p in parts) == 10_000
    out = assemble_chunk(parts)
    assert out.dtype == torch.int32 and torch.equal(out, tokens)


def test_assemble_accepts_any_order_and_identical_redelivery() -> None:
    tokens = text(1000)
    parts = [decode(r, TEXT, "ptb") for r in encode_chunk("ptb", 2, tokens=tokens, max_part_bytes=1024)]
    shuffled = parts + [decode(encode_chunk("ptb", 2, tokens=tokens, max_part_bytes=1024)[1], TEXT, "ptb")]
    random.Random(0).shuffle(shuffled)
    assert torch.equal(assemble_chunk(shuffled), tokens)


def test_encoding_is_deterministic() -> None:
    x, y = labeled(50, (32, 32, 3))
    first = encode_chunk("cifar", 4, x, y, max_part_bytes=50_000)
    assert len(first) > 1 and first == encode_chunk("cifar", 4, x.clone(), y.clone(), max_part_bytes=50_000)


def test_unrelated_headers_are_ignored() -> None:
    record = with_extra_header(("traceparent", b"00-abc-01"), ("x-other", b"\xff"))
    assert decode(record).examples == 4


def _parts(n_parts: int = 3) -> list[DecodedPart]:
    x, y = labeled(30, (28, 28))
    records = encode_chunk("mnist", 7, x, y, max_part_bytes=len(good().value) * 3)
    assert len(records) == n_parts
    return [decode(r) for r in records]


def test_assemble_rejects_a_missing_part() -> None:
    parts = _parts()
    with pytest.raises(RejectedRecord) as caught:
        assemble_chunk([parts[0], parts[2]])
    assert caught.value.reason == "part_numbering" and "part 1 missing" in caught.value.detail


def test_assemble_rejects_a_duplicate_with_different_content() -> None:
    parts = _parts()
    impostor = dataclasses.replace(parts[1], y=(parts[1].y + 1) % 10)
    with pytest.raises(RejectedRecord) as caught:
        assemble_chunk(parts + [impostor])
    assert caught.value.reason == "part_numbering"


def test_assemble_rejects_parts_that_disagree_on_the_part_count() -> None:
    parts = _parts()
    with pytest.raises(RejectedRecord) as caught:
        assemble_chunk(parts[:2] + [dataclasses.replace(parts[2], parts=4)])
    assert caught.value.reason == "part_numbering"


def test_assemble_rejects_parts_of_another_chunk_and_an_empty_list() -> None:
    parts = _parts()
    for bad in ([], parts[:2] + [dataclasses.replace(parts[2], chunk_id=8)]):
        with pytest.raises(RejectedRecord) as caught:
            assemble_chunk(bad)
        assert caught.value.reason == "part_numbering"


def test_assemble_rejects_mixed_x_dtypes() -> None:
    parts = _parts()
    mixed = parts[:2] + [dataclasses.replace(parts[2], x=parts[2].x.float())]
    with pytest.raises(RejectedRecord) as caught:
        assemble_chunk(mixed)
    assert caught.value.reason == "dtype"


def test_chunk_order_guard_takes_chunks_in_any_order_within_its_window() -> None:
    guard = ChunkOrderGuard({"mnist": [5]}, max_ahead=10)
    guard.check("mnist", 5)  # redelivered part of the completed chunk: ingest dedups it
    assert guard.is_completed("mnist", 5) and not guard.is_completed("mnist", 4)
    guard.check("mnist", 9)
    guard.check("cifar", 1)  # streams are independent
    guard.complete("mnist", 9)
    guard.complete("mnist", 6)  # completing an older in-flight chunk never moves the mark back
    assert guard.last_completed("mnist") == 9 and guard.last_completed("cifar") is None
    guard.check("mnist", 8)  # older than the newest completed chunk: still valid data
    guard.complete("mnist", 15)
    assert guard.completed("mnist") == {6, 9, 15}  # 5 fell out of the window
    assert guard.behind_window("mnist", 5) and not guard.behind_window("mnist", 6)
    guard.check("mnist", 6)
    with pytest.raises(RejectedRecord) as caught:
        guard.check("mnist", 5)
    assert caught.value.reason == "chunk_order" and "10 ids behind chunk 15" in caught.value.detail


def test_chunk_order_guard_rejects_a_chunk_too_far_ahead_and_the_next_chunk_still_passes() -> None:
    """One record with a wild id (near 2**53) must not become the newest completed chunk, which would
    make every later, correct chunk "older" than it."""
    guard = ChunkOrderGuard({"mnist": [5]}, max_ahead=1000)
    for wild in (MAX_ID, 5 + 1001):
        with pytest.raises(RejectedRecord) as caught:
            guard.check("mnist", wild)
        assert caught.value.reason == "chunk_ahead"
        assert f"chunk {wild} of stream 'mnist' is {wild - 5} ids ahead of chunk 5, the newest" in caught.value.detail
        assert "daemon.max_chunks_ahead allows 1000" in caught.value.detail
    guard.check("mnist", 6)
    guard.check("mnist", 5 + 1000)  # a jump up to the bound passes (chunks lost in between)
    guard.complete("mnist", 6)
    guard.check("mnist", 6 + 1000)  # the bound follows the newest completed chunk
    assert guard.last_completed("mnist") == 6
    # The first chunk sets the origin: a producer may start its ids anywhere.
    fresh = ChunkOrderGuard(max_ahead=1000)
    fresh.check("mnist", 20261123)
    fresh.complete("mnist", 20261123)
    with pytest.raises(RejectedRecord):
        fresh.check("mnist", 20261123 + 1001)
    unbounded = ChunkOrderGuard({"mnist": [5]})
    unbounded.check("mnist", MAX_ID)  # max_ahead None: no bound either way
    unbounded.complete("mnist", MAX_ID)
    unbounded.check("mnist", 1)
    assert unbounded.is_completed("mnist", 5)
    with pytest.raises(RejectedRecord) as caught:
        fresh.check("other", 0)  # the engine could never take it: it would wait in the buffer
    assert caught.value.reason == "chunk_order" and "chunk ids start at 1" in caught.value.detail
    with pytest.raises(ValueError, match="max_ahead"):
        ChunkOrderGuard(max_ahead=0)


def test_rejected_record_has_a_fixed_reason_set_and_pickles() -> None:
    with pytest.raises(ValueError):
        RejectedRecord("something_new", "unbounded label values are not allowed")
    # copy.copy rebuilds it through __reduce_ex__, as unpickling would, without unpickling anything.
    error = copy.copy(RejectedRecord("size", "too big"))
    assert (error.reason, error.detail, str(error)) == ("size", "too big", "size: too big")


def test_single_example_over_the_limit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one example of stream 'cifar' needs .* max_part_bytes=2048"):
        encode_chunk("cifar", 1, *labeled(3, (32, 32, 3)), max_part_bytes=2048)


@pytest.mark.parametrize(
    "kwargs,names",
    [
        ({"stream": "has/slash"}, "stream name"),
        ({"stream": "{tag}"}, "stream name"),
        ({"stream": ""}, "stream name"),
        ({"chunk_id": -1}, "chunk_id"),
        ({"chunk_id": 2**53}, "chunk_id"),
        ({"chunk_id": True}, "chunk_id"),
        ({"x": torch.zeros(4, 28, 28, dtype=torch.float64)}, "x must be uint8 or float32"),
        ({"x": torch.zeros(0, 28, 28, dtype=torch.uint8), "y": torch.zeros(0, dtype=torch.int64)}, "x must be N x"),
        ({"y": torch.zeros(4, dtype=torch.int32)}, "y must be int64 .class labels. or float32"),
        ({"y": torch.zeros(3, dtype=torch.int64)}, "y must have shape"),
        ({"tokens": torch.zeros(5, dtype=torch.int32)}, "not both"),
        ({"x": None}, "x and y together"),
        ({"max_part_bytes": 0}, "max_part_bytes"),
    ],
)
def test_encoder_rejects_malformed_input_naming_the_argument(kwargs: dict, names: str) -> None:
    args = {"stream": "mnist", "chunk_id": 1, "x": mnist_x(), "y": mnist_y()} | kwargs
    with pytest.raises(ValueError, match=names):
        encode_chunk(**args)


@pytest.mark.parametrize(
    "kwargs,names",
    [
        ({"kind": "image", "num_classes": 10}, "kind"),
        ({"kind": "labeled", "example_shape": (28, 28)}, "num_classes"),
        ({"kind": "labeled", "example_shape": (28, 0), "num_classes": 10}, "example_shape"),
        ({"kind": "labeled", "example_shape": (28,), "num_classes": 10, "x_dtypes": ("float64",)}, "x_dtypes"),
        ({"kind": "text"}, "vocab_size"),
        ({"kind": "text", "vocab_size": 100, "max_part_bytes": 0}, "max_part_bytes"),
    ],
)
def test_stream_schema_rejects_bad_configuration_naming_the_field(kwargs: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        StreamSchema(**kwargs)


def test_stream_schema_accepts_lists_from_yaml() -> None:
    schema = StreamSchema(kind="labeled", example_shape=[32, 32, 3], x_dtypes=["uint8"], num_classes=10)
    assert schema.example_shape == (32, 32, 3) and schema.x_dtypes == ("uint8",)
